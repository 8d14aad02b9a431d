//! Compiles the `.proto` contract under `static/proto/` with protox (pure
//! Rust, offline) and generates message types and service traits with
//! connectrpc-build. It also writes `rpc_methods.rs`, the list of every RPC
//! method with its streaming shape, and `rpc_schemas.json`, the JSON
//! Schema of every message in its proto3 JSON form, which `/openapi.json`
//! publishes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prost::Message as _;

fn main() {
    let proto_root = Path::new("static/proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let mut files = Vec::new();
    collect_protos(proto_root, &mut files);
    files.sort();
    let relative: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(proto_root)
                .expect("under the proto root")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();

    let mut compiler = protox::Compiler::new([proto_root]).expect("proto include path");
    compiler.include_source_info(true).include_imports(true);
    for file in &relative {
        compiler
            .open_file(file)
            .unwrap_or_else(|e| panic!("compiling {file}: {e}"));
    }
    let set = compiler.file_descriptor_set();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let descriptor_path = out_dir.join("agentbay_descriptor.bin");
    std::fs::write(&descriptor_path, set.encode_to_vec()).expect("write descriptor set");
    std::fs::write(out_dir.join("rpc_methods.rs"), rpc_method_table(&set))
        .expect("write rpc table");
    std::fs::write(out_dir.join("rpc_schemas.json"), json_schemas(&set))
        .expect("write rpc schemas");

    connectrpc_build::Config::new()
        .descriptor_set(&descriptor_path)
        .files(&relative)
        .include_file("_connectrpc.rs")
        .compile()
        .expect("generate RPC code");
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read proto dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            collect_protos(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
}

/// Renders `pub const RPC_METHODS: &[RpcMethod]` from the descriptors, so
/// the published method list can never drift from the contract.
fn rpc_method_table(set: &prost_types::FileDescriptorSet) -> String {
    let mut out = String::from("&[\n");
    for file in &set.file {
        if !file.name().starts_with("agentbay/") {
            continue;
        }
        let comments = leading_comments(file);
        for (si, service) in file.service.iter().enumerate() {
            for (mi, method) in service.method.iter().enumerate() {
                let doc = comments
                    .get(&vec![6, si as i32, 2, mi as i32])
                    .cloned()
                    .unwrap_or_default();
                writeln!(
                    out,
                    "    RpcMethod {{ service: {:?}, method: {:?}, input: {:?}, output: {:?}, server_streaming: {}, client_streaming: {}, doc: {:?} }},",
                    format!("{}.{}", file.package(), service.name()),
                    method.name(),
                    method.input_type().trim_start_matches('.'),
                    method.output_type().trim_start_matches('.'),
                    method.server_streaming(),
                    method.client_streaming(),
                    doc.trim(),
                )
                .expect("write to string");
            }
        }
    }
    out.push(']');
    out
}

fn leading_comments(
    file: &prost_types::FileDescriptorProto,
) -> std::collections::HashMap<Vec<i32>, String> {
    file.source_code_info
        .as_ref()
        .map(|info| {
            info.location
                .iter()
                .filter_map(|l| {
                    l.leading_comments.as_ref().map(|c| {
                        (
                            l.path.clone(),
                            c.split_whitespace().collect::<Vec<_>>().join(" "),
                        )
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The JSON Schema (OpenAPI 3.1) of every message and enum of the
/// contract in its proto3 JSON mapping, by full name: field names in
/// lowerCamelCase, 64-bit integers as strings (numbers accepted), enums by
/// name (numbers accepted), bytes as base64, maps as objects.
///
/// Comments say what proto3 cannot, and become part of the schema:
/// - a field's comment starting `Required`: the server refuses the
///   message without it (a text must not be blank, a list not empty);
/// - `at most N characters`: the text's longest;
/// - `one of: a, b.`: the only values (of each item, for a list);
/// - `a JSON document`: the text is JSON (`format: json`); `a JSON array`:
///   JSON whose top level is an array; `a JSON Schema`: JSON that is a
///   JSON Schema (`format: json-schema`);
/// - `(a UUID)`, `(a slug)`, `(a key)`, `(a day)` (`YYYY-MM-DD`): the
///   text's form;
///
/// and an optional field may always be null, an optional text empty
/// (proto3: absent).
/// - `pattern `REGEX``: the text matches it;
/// - `(an amount)`: a number above 0 in whole thousandths (`Amount`);
/// - `(labels)` on a map: at most 16 keys of 1 to 63 of a-z, 0-9, `.`, `_`,
///   `-` starting with a letter or digit, values of 1 to 128 characters
///   without control characters (`domain::run::parse_labels`);
/// - `Required when `other` is V.`: required only then (V: true, false or
///   a text); `At least N when `other` is V.`: a list that long then;
///   `True only when `other` is V.`: a bool that may be true only then;
///   `Empty unless `other` is V.`: a text that may be given only then;
/// - a message's comment `Needs one of: field_a, field_b.`: at least one
///   of them is given (not empty).
fn json_schemas(set: &prost_types::FileDescriptorSet) -> String {
    use prost_types::field_descriptor_proto::{Label, Type};
    use serde_json::{Map, Value, json};
    const UUID: &str =
        "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    const SLUG: &str = "^[a-z0-9][a-z0-9-]{0,62}$";

    let mut maps = std::collections::HashMap::<String, prost_types::FieldDescriptorProto>::new();
    // Map entries first: a map field's type is its entry message.
    fn collect_maps(
        prefix: &str,
        messages: &[prost_types::DescriptorProto],
        maps: &mut std::collections::HashMap<String, prost_types::FieldDescriptorProto>,
    ) {
        for m in messages {
            let name = format!("{prefix}.{}", m.name());
            if m.options.as_ref().is_some_and(|o| o.map_entry()) {
                let value = m
                    .field
                    .iter()
                    .find(|f| f.name() == "value")
                    .expect("a map value");
                maps.insert(name.clone(), value.clone());
            }
            collect_maps(&name, &m.nested_type, maps);
        }
    }
    for file in &set.file {
        collect_maps(
            &format!(".{}", file.package()),
            &file.message_type,
            &mut maps,
        );
    }
    fn reference(type_name: &str) -> Value {
        if type_name.starts_with(".google.protobuf.") {
            return json!({});
        }
        json!({ "$ref": format!("#/components/schemas/{}", type_name.trim_start_matches('.')) })
    }
    /// A regular expression for the decimals from 1 to `max` (no leading
    /// zero).
    fn up_to(max: &str) -> String {
        let n = max.len();
        let mut alternatives = vec![format!("[1-9][0-9]{{0,{}}}", n - 2)];
        for (i, d) in max.bytes().enumerate() {
            let low = if i == 0 { b'1' } else { b'0' };
            if d > low {
                alternatives.push(format!(
                    "{}[{}-{}][0-9]{{{}}}",
                    &max[..i],
                    low as char,
                    (d - 1) as char,
                    n - i - 1
                ));
            }
        }
        alternatives.push(max.to_string());
        alternatives.join("|")
    }
    fn scalar(field: &prost_types::FieldDescriptorProto) -> Value {
        match field.r#type() {
            Type::Double | Type::Float => json!({"type": "number"}),
            // A quoted 64-bit integer: what the JSON parser takes (a sign,
            // leading zeros), within range.
            Type::Int64 | Type::Sint64 | Type::Sfixed64 => json!({
                "type": ["string", "integer"],
                "pattern": format!("^([+]?0*({})|-0*({})|[+-]?0+)$", up_to(&i64::MAX.to_string()), up_to("9223372036854775808")),
                "minimum": i64::MIN,
                "maximum": i64::MAX,
            }),
            Type::Uint64 | Type::Fixed64 => json!({
                "type": ["string", "integer"],
                "pattern": format!("^[+]?(0*({})|0+)$", up_to(&u64::MAX.to_string())),
                "minimum": 0,
                "maximum": u64::MAX,
            }),
            Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
                json!({"type": "integer", "minimum": i32::MIN, "maximum": i32::MAX})
            }
            Type::Uint32 | Type::Fixed32 => {
                json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})
            }
            Type::Bool => json!({"type": "boolean"}),
            Type::String => json!({"type": "string"}),
            Type::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
            Type::Enum | Type::Message | Type::Group => reference(field.type_name()),
        }
    }
    /// What a field's comment adds to the schema of one value.
    fn annotate(mut value: Value, comment: &str, required: bool) -> Value {
        let text = value["type"] == "string";
        // An optional text field may be empty (proto3: absent).
        let empty_too = |v: Value| {
            if required {
                v
            } else {
                json!({"anyOf": [v, {"type": "string", "maxLength": 0}]})
            }
        };
        if let Some((_, rest)) = comment.split_once("one of: ") {
            // Values may hold dots (scopes): the list ends at ". " or the end.
            let mut values: Vec<&str> = rest
                .split(". ")
                .next()
                .unwrap_or_default()
                .trim_end_matches('.')
                .split(", ")
                .map(str::trim)
                .collect();
            if text && !required {
                values.push("");
            }
            value["enum"] = json!(values);
            return value;
        }
        if value["type"] == "number" && comment.contains("(an amount)") {
            // `domain::amount::Amount`: whole thousandths, above 0, at most
            // a million.
            value["exclusiveMinimum"] = json!(0);
            value["maximum"] = json!(1_000_000);
            value["multipleOf"] = json!(0.001);
        }
        if let Some(n) = comment
            .split_once("(at most ")
            .and_then(|(_, rest)| rest.split(')').next())
            .and_then(|t| t.replace(',', "").parse::<u64>().ok())
        {
            // A bound the handler enforces, published: `(at most N)`.
            if value["type"] == json!(["string", "integer"]) {
                value["maximum"] = json!(n);
                value["pattern"] = json!(format!("^[+]?(0*({})|0+)$", up_to(&n.to_string())));
            } else if value["type"] == "integer" {
                value["maximum"] = json!(n);
            }
        }
        if !text {
            return value;
        }
        if comment.contains("a JSON Schema") {
            // A JSON document that a JSON Schema validator compiles.
            value["format"] = json!("json-schema");
            value["contentMediaType"] = json!("application/schema+json");
            return empty_too(value);
        }
        if comment.contains("a JSON array") {
            // JSON whose top level is an array.
            value["format"] = json!("json");
            value["contentMediaType"] = json!("application/json");
            value["pattern"] = json!("^[ \\t\\n\\r]*\\[");
            return empty_too(value);
        }
        if comment.contains("a JSON document") {
            // `format: json` lets a client generate one (JSON Schema 2020-12
            // only annotates the content keywords).
            value["format"] = json!("json");
            value["contentMediaType"] = json!("application/json");
            if required {
                value["minLength"] = json!(1);
            }
            return empty_too(value);
        }
        if let Some((_, rest)) = comment.split_once("pattern `") {
            let pattern = rest.split('`').next().unwrap_or_default();
            value["pattern"] = json!(pattern);
            return empty_too(value);
        }
        if comment.contains("(a key)") {
            // `FieldError::check_key`: 1 to 128 characters, no '/' or
            // control character.
            value["pattern"] = json!("^[^/\\x00-\\x1f\\x7f-\\x9f]{1,128}$");
            return empty_too(value);
        }
        if comment.contains("(a UUID)") {
            value["pattern"] = json!(UUID);
            return empty_too(value);
        }
        if comment.contains("(a day)") {
            value["format"] = json!("date");
            value["pattern"] = json!("^[0-9]{4}-[0-9]{2}-[0-9]{2}$");
            return empty_too(value);
        }
        if comment.contains("(a slug)") {
            value["pattern"] = json!(SLUG);
            return empty_too(value);
        }
        if required {
            // Not empty and not only blanks (`FieldError::require`).
            value["pattern"] = json!("[^ \\t\\n\\r]");
        }
        if let Some(n) = comment
            .split_once("at most ")
            .and_then(|(_, rest)| rest.split_once(" characters"))
            .and_then(|(n, _)| n.parse::<u64>().ok())
        {
            value["maxLength"] = json!(n);
        }
        value
    }
    fn message(
        prefix: &str,
        m: &prost_types::DescriptorProto,
        doc: Option<&String>,
        comments: &dyn Fn(usize) -> Option<String>,
        maps: &std::collections::HashMap<String, prost_types::FieldDescriptorProto>,
        out: &mut Map<String, Value>,
    ) {
        let name = format!("{prefix}.{}", m.name());
        if m.options.as_ref().is_some_and(|o| o.map_entry()) {
            return;
        }
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut conditions = Vec::new();
        let json_name = |proto: &str| {
            m.field
                .iter()
                .find(|f| f.name() == proto)
                .unwrap_or_else(|| panic!("{name}: no field {proto}"))
                .json_name()
                .to_string()
        };
        for (fi, f) in m.field.iter().enumerate() {
            let comment = comments(fi).unwrap_or_default();
            let needed = comment.starts_with("Required") && !comment.starts_with("Required when");
            // `Required when `other` is V.` and `True only when `other` is V.`
            let condition = |text: &str| -> Option<(String, Value)> {
                let (_, rest) = comment.split_once(text)?;
                let (other, rest) = rest.trim_start_matches('`').split_once('`')?;
                let v = rest
                    .trim_start_matches(" is ")
                    .split(['.', ';', ',', ':', '('])
                    .next()?
                    .trim();
                let v = match v {
                    "true" => json!(true),
                    "false" => json!(false),
                    text => json!(text),
                };
                Some((json_name(other), v))
            };
            let holds = |field: &str, v: &Value| {
                if *v == json!(false) {
                    // proto3: absent or null is false.
                    json!({"properties": {field: {"enum": [false, null]}}})
                } else {
                    json!({"properties": {field: {"const": v}}, "required": [field]})
                }
            };
            if let Some((other, v)) = condition("Required when ") {
                conditions.push(json!({
                    "if": holds(&other, &v),
                    "then": {
                        "required": [f.json_name()],
                        "properties": {f.json_name(): annotate(scalar(f), &comment, true)},
                    },
                }));
            }
            // `At least N when `other` is V.` (a list of at least N items).
            if let Some((_, rest)) = comment.split_once("At least ")
                && let Some((n, _)) = rest.split_once(" when ")
                && let Some((other, v)) = condition(&format!("At least {n} when "))
            {
                let n: u64 = match n {
                    "one" => 1,
                    "two" => 2,
                    "three" => 3,
                    n => n
                        .parse()
                        .unwrap_or_else(|_| panic!("{name}: At least {n}?")),
                };
                conditions.push(json!({
                    "if": holds(&other, &v),
                    "then": {
                        "required": [f.json_name()],
                        "properties": {f.json_name(): {"type": "array", "minItems": n}},
                    },
                }));
            }
            if let Some((other, v)) = condition("Empty unless ") {
                conditions.push(json!({
                    "if": {
                        "properties": {f.json_name(): {"type": "string", "minLength": 1}},
                        "required": [f.json_name()],
                    },
                    "then": holds(&other, &v),
                }));
            }
            if let Some((other, v)) = condition("True only when ") {
                conditions.push(json!({
                    "if": holds(f.json_name(), &json!(true)),
                    "then": holds(&other, &v),
                }));
            }
            // A text named `..._json` carries JSON: its comment says which
            // (and so its schema declares it), or the build stops here.
            assert!(
                f.r#type() != Type::String
                    || !f.name().ends_with("_json")
                    || comment.contains("a JSON document")
                    || comment.contains("a JSON array")
                    || comment.contains("a JSON Schema"),
                "{name}.{}: a `_json` text must say `a JSON document`, `a JSON array` or `a JSON Schema` in its comment",
                f.name()
            );
            let value = if let Some(value) = maps.get(f.type_name()) {
                if comment.contains("(labels)") {
                    json!({
                        "type": "object",
                        "maxProperties": 16,
                        "propertyNames": {"pattern": "^[a-z0-9][a-z0-9._-]{0,62}$"},
                        "additionalProperties": {
                            "type": "string",
                            "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]{1,128}$",
                        },
                    })
                } else {
                    json!({"type": "object", "additionalProperties": scalar(value)})
                }
            } else if f.label() == Label::Repeated {
                let mut list =
                    json!({"type": "array", "items": annotate(scalar(f), &comment, true)});
                if needed {
                    list["minItems"] = json!(1);
                }
                list
            } else {
                annotate(scalar(f), &comment, needed)
            };
            if needed {
                required.push(f.json_name().to_string());
                properties.insert(f.json_name().to_string(), value);
            } else {
                // proto3 JSON: null is the field's default (absent).
                properties.insert(
                    f.json_name().to_string(),
                    json!({"anyOf": [value, {"type": "null"}]}),
                );
            }
        }
        // A field the message does not have is refused, not dropped (the
        // server also takes each field's proto name, as proto3 JSON asks).
        let mut schema =
            json!({"type": "object", "properties": properties, "additionalProperties": false});
        if !required.is_empty() {
            schema["required"] = json!(required);
        }
        if !conditions.is_empty() {
            schema["allOf"] = json!(conditions);
        }
        if let Some((_, rest)) = doc.and_then(|d| d.split_once("Needs one of: ")) {
            let either: Vec<Value> = rest
                .split('.')
                .next()
                .unwrap_or_default()
                .split(", ")
                .map(|f| {
                    let f = json_name(f.trim());
                    json!({"required": [f], "properties": {f.clone(): {"type": "string", "minLength": 1}}})
                })
                .collect();
            schema["anyOf"] = json!(either);
        }
        out.insert(name.trim_start_matches('.').to_string(), schema);
        for n in &m.nested_type {
            message(&name, n, None, &|_| None, maps, out);
        }
        for e in &m.enum_type {
            enumeration(&name, e, out);
        }
    }
    fn enumeration(
        prefix: &str,
        e: &prost_types::EnumDescriptorProto,
        out: &mut Map<String, Value>,
    ) {
        let names: Vec<&str> = e.value.iter().map(|v| v.name()).collect();
        out.insert(
            format!("{prefix}.{}", e.name())
                .trim_start_matches('.')
                .to_string(),
            json!({"anyOf": [{"type": "string", "enum": names}, {"type": "integer"}]}),
        );
    }
    let mut schemas = Map::new();
    // The well-known types keep their own JSON forms (fields of those
    // types are any JSON).
    for file in set.file.iter().filter(|f| f.package() != "google.protobuf") {
        let prefix = format!(".{}", file.package());
        let notes = leading_comments(file);
        for (mi, m) in file.message_type.iter().enumerate() {
            let comments = |fi: usize| notes.get(&vec![4, mi as i32, 2, fi as i32]).cloned();
            let doc = notes.get(&vec![4, mi as i32]);
            message(&prefix, m, doc, &comments, &maps, &mut schemas);
        }
        for e in &file.enum_type {
            enumeration(&prefix, e, &mut schemas);
        }
    }
    serde_json::to_string_pretty(&Value::Object(schemas)).expect("schemas serialise")
}
