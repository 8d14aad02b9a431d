//! A form built from a JSON Schema, and the document a filled form makes.
//!
//! A release's input schema and a question's answer schema become forms
//! (strings, numbers, integers, booleans, enums, arrays of those, and
//! objects of all of them, nested); what a form cannot express (`oneOf`,
//! arrays of objects, open maps, …) gets a JSON box of its own, for that
//! part only. Reading a filled form back gives the JSON document the
//! schema describes; whether it satisfies the schema is the schema's check,
//! made after.

use serde_json::{Map, Value};

use super::FieldError;

/// The form field names' prefix: `f` for the document itself, `f.a.b` for
/// the property `b` of the property `a`.
pub const ROOT: &str = "f";

/// At most this many fields are built; the rest of a larger schema is
/// given as a JSON box.
const MAX_FIELDS: usize = 200;
/// Objects nested deeper than this are given as a JSON box.
const MAX_DEPTH: usize = 6;

/// What kind of input a field is.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// One line of text.
    Text,
    /// Text of several lines (a long `maxLength`, or `format: textarea`).
    LongText,
    /// A whole number.
    Integer,
    /// A number.
    Number,
    /// True or false.
    Boolean,
    /// One of the listed values (of any JSON type), shown as text.
    Choice(Vec<String>),
    /// Several of the listed values.
    Choices(Vec<String>),
    /// A list of texts or numbers, one per line.
    Lines(Box<Kind>),
    /// A JSON document, for what a form cannot express.
    Json,
}

/// One input of a form.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// The form field's name (`f.customer`, `f.address.city`).
    pub name: String,
    /// The JSON path it fills (`/customer`), `/` for the document itself.
    pub path: String,
    /// The schema's title, else the property's name (`address › city`).
    pub label: String,
    /// The schema's description.
    pub help: String,
    /// The input.
    pub kind: Kind,
    /// The schema requires it.
    pub required: bool,
    /// What the field holds at first: the schema's default.
    pub value: String,
    /// An example (the schema's `examples`), shown as a placeholder.
    pub example: String,
}

impl Field {
    /// Whether `choice` is the field's value (for a choice), or one of its
    /// lines (for several choices).
    pub fn holds(&self, choice: &str) -> bool {
        match self.kind {
            Kind::Choices(_) => self.value.lines().any(|l| l == choice),
            _ => self.value == choice,
        }
    }

    /// The input's name for the template: text, longtext, integer, number,
    /// boolean, choice, choices, lines, json.
    pub fn input(&self) -> &'static str {
        match self.kind {
            Kind::Text => "text",
            Kind::LongText => "longtext",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::Boolean => "boolean",
            Kind::Choice(_) => "choice",
            Kind::Choices(_) => "choices",
            Kind::Lines(_) => "lines",
            Kind::Json => "json",
        }
    }

    /// The listed values of a choice.
    pub fn options(&self) -> &[String] {
        match &self.kind {
            Kind::Choice(o) | Kind::Choices(o) => o,
            _ => &[],
        }
    }
}

/// The fields of a form built from a schema.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Form {
    /// In the schema's order.
    pub fields: Vec<Field>,
}

impl Form {
    /// The form of `schema`. `start`, when given, is a document whose
    /// values the fields hold at first (instead of the defaults).
    pub fn of(schema: &Value, start: Option<&Value>) -> Form {
        let mut form = Form::default();
        form.add(schema, &[], "", true, start, 0);
        form
    }

    /// Whether the form is only a JSON box for the whole document.
    pub fn is_json_only(&self) -> bool {
        self.fields.len() == 1 && self.fields[0].kind == Kind::Json && self.fields[0].path == "/"
    }

    fn add(
        &mut self,
        schema: &Value,
        at: &[String],
        label: &str,
        required: bool,
        start: Option<&Value>,
        depth: usize,
    ) {
        let title = schema
            .get("title")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| label.to_string());
        let help = schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(properties) = object_properties(schema)
            && depth < MAX_DEPTH
            && self.fields.len() + properties.len() <= MAX_FIELDS
        {
            let needed: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (name, property) in properties {
                let mut path = at.to_vec();
                path.push(name.clone());
                let label = if title.is_empty() {
                    name.clone()
                } else {
                    format!("{title} › {name}")
                };
                let start = start.and_then(|s| s.get(&name));
                // A property of an optional object is required only when
                // the object is given; the schema's check says so then.
                let required = required && needed.contains(&name.as_str());
                self.add(&property, &path, &label, required, start, depth + 1);
            }
            return;
        }
        let kind = kind_of(schema);
        let shown = |v: &Value| display(&kind, v);
        let value = start
            .map(shown)
            .or_else(|| schema.get("default").map(shown))
            .unwrap_or_default();
        let example = schema
            .get("examples")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
            .or_else(|| schema.get("example"))
            .map(shown)
            .unwrap_or_default();
        self.fields.push(Field {
            name: name_of(at),
            path: pointer(at),
            label: if title.is_empty() {
                "Value".to_string()
            } else {
                title
            },
            help,
            kind,
            required,
            value,
            example,
        });
    }

    /// The document the filled form makes: `values(name)` gives every
    /// value the form sent under a field's name. A blank optional field is
    /// left out; a value that is not what its field takes is an error
    /// naming the field.
    pub fn read<'a>(&self, values: impl Fn(&str) -> Vec<&'a str>) -> Result<Value, FieldError> {
        let mut document = Value::Object(Map::new());
        for field in &self.fields {
            let sent = values(&field.name);
            let Some(value) = parse(field, &sent)? else {
                continue;
            };
            if field.path == "/" {
                return Ok(value);
            }
            place(&mut document, &field.path, value);
        }
        Ok(document)
    }
}

/// The properties of an object schema a form can lay out, in order.
fn object_properties(schema: &Value) -> Option<Vec<(String, Value)>> {
    let object = schema.as_object()?;
    let typed = matches!(object.get("type"), Some(Value::String(t)) if t == "object");
    let properties = object.get("properties")?.as_object()?;
    let composed = [
        "oneOf",
        "anyOf",
        "allOf",
        "if",
        "not",
        "$ref",
        "patternProperties",
    ]
    .iter()
    .any(|k| object.contains_key(*k));
    // Extra properties the schema allows cannot be named by a form; a
    // closed or unspecified object can.
    let open = matches!(object.get("additionalProperties"), Some(Value::Object(_)));
    // The order of a schema's properties does not survive parsing, so the
    // required ones come first, in the order `required` lists them, then
    // the rest by name.
    let required: Vec<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    (typed && !composed && !open && !properties.is_empty()).then(|| {
        let mut ordered: Vec<(String, Value)> = required
            .iter()
            .filter_map(|k| properties.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        ordered.extend(
            properties
                .iter()
                .filter(|(k, _)| !required.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        ordered
    })
}

fn simple(schema: &Value) -> bool {
    let Some(object) = schema.as_object() else {
        return false;
    };
    !["oneOf", "anyOf", "allOf", "if", "not", "$ref"]
        .iter()
        .any(|k| object.contains_key(*k))
}

fn choices(schema: &Value) -> Option<Vec<String>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![text_of(c)]);
    }
    schema
        .get("enum")
        .and_then(Value::as_array)
        .map(|e| e.iter().map(text_of).collect())
}

fn kind_of(schema: &Value) -> Kind {
    if !simple(schema) {
        return Kind::Json;
    }
    if let Some(options) = choices(schema) {
        return Kind::Choice(options);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => {
            let long = schema.get("format").and_then(Value::as_str) == Some("textarea")
                || schema
                    .get("maxLength")
                    .and_then(Value::as_u64)
                    .is_some_and(|m| m > 200);
            if long { Kind::LongText } else { Kind::Text }
        }
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        Some("array") => match schema.get("items") {
            Some(items) if simple(items) => match (choices(items), kind_of(items)) {
                (Some(options), _) => Kind::Choices(options),
                (None, k @ (Kind::Text | Kind::Integer | Kind::Number)) => Kind::Lines(Box::new(k)),
                _ => Kind::Json,
            },
            _ => Kind::Json,
        },
        _ => Kind::Json,
    }
}

/// A value as an enum option shows it: a string as itself, anything else
/// as JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A value as a field of `kind` holds it.
fn display(kind: &Kind, v: &Value) -> String {
    match (kind, v) {
        (Kind::Json, v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        (Kind::Lines(_) | Kind::Choices(_), Value::Array(items)) => {
            items.iter().map(text_of).collect::<Vec<_>>().join("\n")
        }
        (_, v) => text_of(v),
    }
}

fn name_of(at: &[String]) -> String {
    std::iter::once(ROOT)
        .chain(at.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(".")
}

fn pointer(at: &[String]) -> String {
    if at.is_empty() {
        return "/".to_string();
    }
    at.iter()
        .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn place(document: &mut Value, path: &str, value: Value) {
    let mut here = document;
    let parts: Vec<String> = path
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let Value::Object(map) = here else { return };
        if i + 1 == parts.len() {
            map.insert(part.clone(), value);
            return;
        }
        here = map
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// The value of one field, `None` when it is left blank.
fn parse(field: &Field, sent: &[&str]) -> Result<Option<Value>, FieldError> {
    let named = field.name.strip_prefix("f.").unwrap_or("value");
    let bad = |why: String| FieldError::new(named, why);
    let one = sent.first().copied().unwrap_or("");
    let item = |kind: &Kind, text: &str| -> Result<Value, FieldError> {
        match kind {
            Kind::Integer => text
                .trim()
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| bad(format!("{:?} is not a whole number", text.trim()))),
            Kind::Number => text
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| bad(format!("{:?} is not a number", text.trim()))),
            _ => Ok(Value::String(text.to_string())),
        }
    };
    let option = |text: &str| -> Result<Value, FieldError> {
        let listed = field.options().iter().any(|o| o == text);
        if !listed {
            return Err(bad(format!(
                "{text:?} is not one of {}",
                field.options().join(", ")
            )));
        }
        // An option shown as JSON (a number, null) is that value.
        Ok(serde_json::from_str::<Value>(text)
            .ok()
            .filter(|v| !v.is_string())
            .unwrap_or_else(|| Value::String(text.to_string())))
    };
    match &field.kind {
        // A checkbox sends its value only when it is ticked, after the
        // hidden `false` the form puts before it.
        Kind::Boolean => {
            let mut value = None;
            for text in sent.iter().map(|t| t.trim()) {
                value = match text {
                    "" => value,
                    "false" => Some(false),
                    "true" | "on" => Some(true),
                    other => return Err(bad(format!("{other:?} is not true or false"))),
                };
            }
            Ok(match value {
                None if !field.required => None,
                v => Some(Value::Bool(v.unwrap_or(false))),
            })
        }
        Kind::Choices(_) => {
            let picked: Vec<Value> = sent
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| option(s))
                .collect::<Result<_, _>>()?;
            Ok((!picked.is_empty() || field.required).then_some(Value::Array(picked)))
        }
        _ if one.trim().is_empty() => Ok(None),
        Kind::Choice(_) => option(one).map(Some),
        Kind::Lines(kind) => one
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| item(kind, l))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| Some(Value::Array(v))),
        Kind::Json => serde_json::from_str::<Value>(one)
            .map(Some)
            .map_err(|e| bad(format!("is not JSON: {e}"))),
        kind @ (Kind::Integer | Kind::Number) => item(kind, one).map(Some),
        Kind::Text | Kind::LongText => Ok(Some(Value::String(one.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sent<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Vec<&'a str> {
        move |name| {
            pairs
                .iter()
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| *v)
                .collect()
        }
    }

    #[test]
    fn an_object_schema_becomes_its_fields_and_reads_back_its_document() {
        let schema = json!({
            "type": "object",
            "required": ["customer", "text"],
            "properties": {
                "customer": {"type": "string", "title": "Customer", "examples": ["acme"]},
                "text": {"type": "string", "maxLength": 4000},
                "priority": {"enum": ["low", "high"], "default": "low"},
                "seats": {"type": "integer"},
                "urgent": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "where": {"type": "object", "properties": {"city": {"type": "string"}}},
                "extra": {"oneOf": [{"type": "string"}, {"type": "number"}]}
            }
        });
        let form = Form::of(&schema, None);
        let names: Vec<_> = form.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "f.customer",
                "f.text",
                "f.extra",
                "f.priority",
                "f.seats",
                "f.tags",
                "f.urgent",
                "f.where.city",
            ]
        );
        assert_eq!(form.fields[0].label, "Customer");
        assert_eq!(form.fields[0].example, "acme");
        assert!(form.fields[0].required && !form.fields[3].required);
        assert_eq!(form.fields[1].kind, Kind::LongText);
        assert_eq!(form.fields[3].value, "low");
        assert_eq!(form.fields[5].kind, Kind::Lines(Box::new(Kind::Text)));
        assert_eq!(form.fields[2].kind, Kind::Json);
        let doc = form
            .read(sent(&[
                ("f.customer", "acme"),
                ("f.text", "about 40 users"),
                ("f.priority", "high"),
                ("f.seats", "40"),
                ("f.urgent", "false"),
                ("f.urgent", "true"),
                ("f.tags", "vpn\n\nlogin\n"),
                ("f.where.city", ""),
                ("f.extra", "7"),
            ]))
            .unwrap();
        assert_eq!(
            doc,
            json!({"customer": "acme", "text": "about 40 users", "priority": "high",
                   "seats": 40, "urgent": true, "tags": ["vpn", "login"], "extra": 7})
        );
    }

    #[test]
    fn a_field_that_is_not_what_it_takes_is_named() {
        let schema = json!({"type": "object", "properties": {
            "seats": {"type": "integer", "title": "Seats"},
            "level": {"enum": [1, 2]}}});
        let form = Form::of(&schema, None);
        let e = form.read(sent(&[("f.seats", "forty")])).unwrap_err();
        assert_eq!(e.field, "seats");
        assert!(
            e.reason.contains("\"forty\" is not a whole number"),
            "{e:?}"
        );
        let e = form.read(sent(&[("f.level", "3")])).unwrap_err();
        assert!(e.reason.contains("is not one of 1, 2"), "{e:?}");
        assert_eq!(
            form.read(sent(&[("f.level", "2")])).unwrap(),
            json!({"level": 2})
        );
    }

    #[test]
    fn a_schema_of_one_value_is_one_field_and_what_a_form_cannot_express_is_json() {
        let form = Form::of(&json!({"type": "string"}), None);
        assert_eq!(form.fields.len(), 1);
        assert_eq!(form.fields[0].name, "f");
        assert_eq!(
            form.read(sent(&[("f", "about 40 users, since Monday")]))
                .unwrap(),
            json!("about 40 users, since Monday")
        );
        let form = Form::of(&json!({"type": "array", "items": {"type": "object"}}), None);
        assert!(form.is_json_only());
        assert_eq!(
            form.read(sent(&[("f", "[{\"a\":1}]")])).unwrap(),
            json!([{"a": 1}])
        );
        let choices = Form::of(
            &json!({"type": "array", "items": {"enum": ["a", "b", "c"]}}),
            Some(&json!(["b"])),
        );
        assert!(choices.fields[0].holds("b") && !choices.fields[0].holds("a"));
        assert_eq!(
            choices.read(sent(&[("f", "a"), ("f", "c")])).unwrap(),
            json!(["a", "c"])
        );
    }

    #[test]
    fn a_start_document_fills_the_fields() {
        let schema = json!({"type": "object", "properties": {
            "to": {"type": "string"}, "amount": {"type": "number"}}});
        let form = Form::of(&schema, Some(&json!({"to": "ops@site", "amount": 12.5})));
        assert_eq!(form.fields[0].value, "12.5");
        assert_eq!(form.fields[1].value, "ops@site");
    }
}
