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
                    l.leading_comments
                        .as_ref()
                        .map(|c| (l.path.clone(), c.replace('\n', " ").trim().to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The JSON Schema (OpenAPI 3.1) of every message and enum of the
/// contract in its proto3 JSON mapping, by full name: field names in
/// lowerCamelCase, 64-bit integers as strings (numbers accepted), enums by
/// name (numbers accepted), bytes as base64, maps as objects.
fn json_schemas(set: &prost_types::FileDescriptorSet) -> String {
    use prost_types::field_descriptor_proto::{Label, Type};
    let mut schemas = Vec::<(String, String)>::new();
    let mut maps = std::collections::HashMap::<String, (String, String)>::new();
    // Map entries first: a map field's type is its entry message.
    fn collect_maps(
        prefix: &str,
        messages: &[prost_types::DescriptorProto],
        maps: &mut std::collections::HashMap<String, (String, String)>,
    ) {
        for m in messages {
            let name = format!("{prefix}.{}", m.name());
            if m.options.as_ref().is_some_and(|o| o.map_entry()) {
                let value = m
                    .field
                    .iter()
                    .find(|f| f.name() == "value")
                    .expect("a map value");
                maps.insert(
                    name.clone(),
                    (
                        value.type_name().to_string(),
                        format!("{:?}", value.r#type()),
                    ),
                );
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
    fn scalar(field: &prost_types::FieldDescriptorProto) -> String {
        match field.r#type() {
            Type::Double | Type::Float => r#"{"type": "number"}"#.into(),
            Type::Int64 | Type::Sint64 | Type::Sfixed64 => {
                r#"{"type": ["string", "integer"], "pattern": "^-?[0-9]+$"}"#.into()
            }
            Type::Uint64 | Type::Fixed64 => {
                r#"{"type": ["string", "integer"], "pattern": "^[0-9]+$", "minimum": 0}"#.into()
            }
            Type::Int32 | Type::Sint32 | Type::Sfixed32 => {
                r#"{"type": "integer", "minimum": -2147483648, "maximum": 2147483647}"#.into()
            }
            Type::Uint32 | Type::Fixed32 => {
                r#"{"type": "integer", "minimum": 0, "maximum": 4294967295}"#.into()
            }
            Type::Bool => r#"{"type": "boolean"}"#.into(),
            Type::String => r#"{"type": "string"}"#.into(),
            Type::Bytes => r#"{"type": "string", "contentEncoding": "base64"}"#.into(),
            Type::Enum | Type::Message | Type::Group => reference(field.type_name()),
        }
    }
    fn reference(type_name: &str) -> String {
        if type_name.starts_with(".google.protobuf.") {
            return "{}".into();
        }
        format!(
            r##"{{"$ref": "#/components/schemas/{}"}}"##,
            type_name.trim_start_matches('.')
        )
    }
    /// A field's comment may say what proto3 cannot: `Required` first
    /// (the server refuses the message without it), `(a UUID)`, `(a slug)`,
    /// `one of: a, b.` (the only values).
    fn annotate(schema: String, comment: Option<&String>) -> (String, bool) {
        let Some(c) = comment else {
            return (schema, false);
        };
        let required = c.starts_with("Required");
        let mut extra = Vec::new();
        if let Some((_, rest)) = c.split_once("one of: ") {
            let values: Vec<String> = rest
                .split('.')
                .next()
                .unwrap_or_default()
                .split(", ")
                .map(|v| format!("{:?}", v.trim()))
                .collect();
            extra.push(format!(r#""enum": [{}]"#, values.join(", ")));
        }
        if c.contains("(a UUID)") {
            extra.push(r#""format": "uuid""#.to_string());
        }
        if c.contains("(a slug)") {
            extra.push(r#""pattern": "^[a-z0-9][a-z0-9-]{0,62}$""#.to_string());
        }
        if required && schema == r#"{"type": "string"}"# {
            extra.push(r#""minLength": 1"#.to_string());
        }
        if extra.is_empty() {
            return (schema, required);
        }
        let open = schema.trim_end_matches('}');
        (format!("{open}, {}}}", extra.join(", ")), required)
    }
    fn message(
        prefix: &str,
        m: &prost_types::DescriptorProto,
        comments: &dyn Fn(usize) -> Option<String>,
        maps: &std::collections::HashMap<String, (String, String)>,
        out: &mut Vec<(String, String)>,
    ) {
        let name = format!("{prefix}.{}", m.name());
        if m.options.as_ref().is_some_and(|o| o.map_entry()) {
            return;
        }
        let mut properties = Vec::new();
        let mut required = Vec::new();
        for (fi, f) in m.field.iter().enumerate() {
            let value = if let Some((value_type, kind)) = maps.get(f.type_name()) {
                let value = match kind.as_str() {
                    "Message" | "Enum" => reference(value_type),
                    _ => {
                        let entry = m
                            .nested_type
                            .iter()
                            .find(|n| format!("{name}.{}", n.name()) == f.type_name())
                            .expect("the map entry");
                        scalar(entry.field.iter().find(|x| x.name() == "value").unwrap())
                    }
                };
                format!(r#"{{"type": "object", "additionalProperties": {value}}}"#)
            } else if f.label() == Label::Repeated {
                format!(r#"{{"type": "array", "items": {}}}"#, scalar(f))
            } else {
                scalar(f)
            };
            let (value, needed) = annotate(value, comments(fi).as_ref());
            if needed {
                required.push(format!("{:?}", f.json_name()));
            }
            properties.push(format!("{:?}: {value}", f.json_name()));
        }
        let required = if required.is_empty() {
            String::new()
        } else {
            format!(r#", "required": [{}]"#, required.join(", "))
        };
        out.push((
            name.trim_start_matches('.').to_string(),
            format!(
                r#"{{"type": "object", "properties": {{{}}}{required}}}"#,
                properties.join(", ")
            ),
        ));
        for n in &m.nested_type {
            message(&name, n, &|_| None, maps, out);
        }
        for e in &m.enum_type {
            out.push(enumeration(&name, e));
        }
    }
    fn enumeration(prefix: &str, e: &prost_types::EnumDescriptorProto) -> (String, String) {
        let names: Vec<String> = e.value.iter().map(|v| format!("{:?}", v.name())).collect();
        (
            format!("{prefix}.{}", e.name())
                .trim_start_matches('.')
                .to_string(),
            format!(
                r#"{{"anyOf": [{{"type": "string", "enum": [{}]}}, {{"type": "integer"}}]}}"#,
                names.join(", ")
            ),
        )
    }
    // The well-known types keep their own JSON forms (fields of those
    // types are any JSON).
    for file in set.file.iter().filter(|f| f.package() != "google.protobuf") {
        let prefix = format!(".{}", file.package());
        let notes = leading_comments(file);
        for (mi, m) in file.message_type.iter().enumerate() {
            let comments = |fi: usize| notes.get(&vec![4, mi as i32, 2, fi as i32]).cloned();
            message(&prefix, m, &comments, &maps, &mut schemas);
        }
        for e in &file.enum_type {
            schemas.push(enumeration(&prefix, e));
        }
    }
    let body: Vec<String> = schemas
        .iter()
        .map(|(name, schema)| format!("{name:?}: {schema}"))
        .collect();
    format!("{{{}}}", body.join(",\n"))
}
