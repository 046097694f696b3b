//! The API document (OpenAPI 3.1) of the live platforms, generated from
//! their descriptions, so that a platform added by a file and a reload is
//! documented like the others, with nothing written by hand.
//!
//! [`document`] takes a base document and adds to it, for each platform:
//! a tag; a path `/v1/{platform}/{endpoint}` per endpoint, with its
//! `operationId`, words, parameters, success answer (the envelope, its
//! example from the description's, its links) and error answers; the
//! parameters' and objects' schemas; the `Platform` schema's values and
//! the endpoints of the account's `costs`.
//!
//! The base is the host's (`openapi/base.json`): the service's own paths,
//! the components every platform shares, and under `x-platforms` (removed
//! from the result) what a platform's operation is made of: the headers,
//! the error answers, the words about costs and cursors. This module knows
//! the description format; the base knows the HTTP surface.
//!
//! Names: a platform's components and default `operationId`s start with
//! its `openapi_prefix` (UpperCamel of its name when absent): objects
//! `{prefix}{Object}`, envelopes `{prefix}{Endpoint}Response`, shared
//! parameters `{prefix}{Parameter}`, the others `{prefix}{Endpoint}{Parameter}`,
//! unless `openapi_name` says otherwise; `operationId`s `get{prefix}{Endpoint}`
//! (one object) or `list{prefix}{Endpoint}` unless `operation_id` says
//! otherwise. A name given twice, by two platforms or by a platform and
//! the base, is refused rather than letting one shadow the other.

use crate::description::{
    Description, Endpoint, Field, FieldType, ObjectType, Parameter, ParameterKind, Shape,
};
use crate::CountRule;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The key of the base document that holds the template of a platform's
/// operation.
pub const TEMPLATE_KEY: &str = "x-platforms";

const TIMESTAMP: &str = "Timestamp";
const NULLABLE_TIMESTAMP: &str = "NullableTimestamp";
const TIMESTAMP_PATTERN: &str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$";
/// `format = "url"`: what `answer::is_web_url` takes, as a pattern: a
/// scheme of `http` or `https` in any case, a host, and none of the
/// characters it refuses.
const URL_PATTERN: &str =
    r#"^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\u0000-\u0020"<>\\`\u007f][^\u0000-\u0020"<>\\`\u007f]*$"#;
/// Unicode's control characters (general category Cc), which engines
/// without Unicode classes cannot name.
const CONTROLS: &str = r"\u0000-\u001F\u007F-\u009F";

/// Why no document could be made. `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// The base document lacks or misshapes something the generator needs.
    #[error("the base document {0}")]
    Base(String),
    #[error("platform {0:?} is given twice")]
    PlatformTwice(String),
    /// A component name or `operationId` of the platform is already the
    /// base's or another platform's.
    #[error("platform {platform:?}: the {kind} {name:?} is already another's in the document")]
    NameTaken {
        platform: String,
        kind: &'static str,
        name: String,
    },
}

/// The template of a platform's operation, from the base's `x-platforms`.
#[derive(Debug, Deserialize)]
struct Template {
    operation: OperationTemplate,
    /// The schema of an envelope's `platform`: a `$ref` to the schema
    /// whose values are the live platforms.
    platform: Value,
    meta: MetaTemplate,
    example_meta: ExampleMeta,
    /// `{subjects}`, `{cursor}`.
    cursor_description_end: String,
    /// `{cursor}`.
    next_page_link: String,
    object_description_end: String,
    /// JSON pointers of the account's `costs` schema and example.
    costs: [String; 2],
}

#[derive(Debug, Deserialize)]
struct OperationTemplate {
    parameters_before: Vec<Value>,
    parameters_after: Vec<Value>,
    /// `{cost}`.
    description_end: String,
    success_headers: Map<String, Value>,
    list_only_headers: Vec<String>,
    responses: Map<String, Value>,
    /// In place of `responses`' for an endpoint with `not_found = false`.
    responses_without_not_found: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct MetaTemplate {
    one: Value,
    list: Value,
}

#[derive(Debug, Deserialize)]
struct ExampleMeta {
    request_id: String,
    next_cursor: String,
}

/// The document of `platforms`, in that order, made from `base` (see the
/// module's documentation).
pub fn document(mut base: Value, platforms: &[&Description]) -> Result<Value, DocumentError> {
    let template = base
        .as_object_mut()
        .ok_or_else(|| DocumentError::Base("is not a JSON object".into()))?
        .remove(TEMPLATE_KEY)
        .ok_or_else(|| DocumentError::Base(format!("has no `{TEMPLATE_KEY}`")))?;
    let template: Template = serde_json::from_value(template)
        .map_err(|e| DocumentError::Base(format!("has a malformed `{TEMPLATE_KEY}`: {e}")))?;

    let mut names = Names::of_base(&base);
    let mut seen = BTreeSet::new();
    let mut out = Generated::default();
    for platform in platforms {
        if !seen.insert(platform.name()) {
            return Err(DocumentError::PlatformTwice(platform.name().to_owned()));
        }
        add_platform(&template, &mut names, &mut out, platform)?;
    }
    if out.timestamp {
        out.schemas
            .insert(TIMESTAMP.into(), timestamp_schema(false));
    }
    if out.nullable_timestamp {
        out.schemas
            .insert(NULLABLE_TIMESTAMP.into(), timestamp_schema(true));
    }

    merge(&mut base, "tags", out.tags, |base, new| {
        let mut all: Vec<Value> = new;
        all.extend(base.as_array().cloned().unwrap_or_default());
        Value::Array(all)
    })?;
    merge(&mut base, "paths", out.paths, |base, new| {
        let mut all = new;
        all.extend(base.as_object().cloned().unwrap_or_default());
        Value::Object(all)
    })?;
    let components = base
        .get_mut("components")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| DocumentError::Base("has no `components`".into()))?;
    for (key, new) in [("parameters", out.parameters), ("schemas", out.schemas)] {
        let mut all = new;
        all.extend(
            components
                .get(key)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        );
        components.insert(key.into(), Value::Object(all));
    }

    set_platforms(&mut base, &template, platforms)?;
    set_costs(&mut base, &template, &out.costs)?;
    Ok(base)
}

/// Sets `base[key]` to what `join` makes of the base's and the new value.
fn merge<T>(
    base: &mut Value,
    key: &str,
    new: T,
    join: impl FnOnce(&Value, T) -> Value,
) -> Result<(), DocumentError> {
    let old = base.get(key).cloned().unwrap_or(Value::Null);
    let object = base
        .as_object_mut()
        .ok_or_else(|| DocumentError::Base("is not a JSON object".into()))?;
    object.insert(key.into(), join(&old, new));
    Ok(())
}

/// What the platforms add, before it joins the base.
#[derive(Default)]
struct Generated {
    tags: Vec<Value>,
    paths: Map<String, Value>,
    parameters: Map<String, Value>,
    schemas: Map<String, Value>,
    timestamp: bool,
    nullable_timestamp: bool,
    /// Endpoint name to default cost, first platform first.
    costs: Vec<(String, u32)>,
}

/// Names already in the document.
struct Names {
    schemas: BTreeSet<String>,
    parameters: BTreeSet<String>,
    operation_ids: BTreeSet<String>,
}

impl Names {
    fn of_base(base: &Value) -> Names {
        let keys = |key: &str| -> BTreeSet<String> {
            base["components"][key]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        let mut schemas = keys("schemas");
        schemas.extend([TIMESTAMP.to_owned(), NULLABLE_TIMESTAMP.to_owned()]);
        let operation_ids = base["paths"]
            .as_object()
            .into_iter()
            .flat_map(|paths| paths.values())
            .filter_map(Value::as_object)
            .flat_map(|item| item.values())
            .filter_map(|op| op.get("operationId").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        Names {
            schemas,
            parameters: keys("parameters"),
            operation_ids,
        }
    }
}

/// Claims `name` in `taken`, or says whose it already is.
fn claim(
    taken: &mut BTreeSet<String>,
    platform: &Description,
    kind: &'static str,
    name: String,
) -> Result<String, DocumentError> {
    if !taken.insert(name.clone()) {
        return Err(DocumentError::NameTaken {
            platform: platform.name().to_owned(),
            kind,
            name,
        });
    }
    Ok(name)
}

fn add_platform(
    template: &Template,
    names: &mut Names,
    out: &mut Generated,
    platform: &Description,
) -> Result<(), DocumentError> {
    let prefix = platform
        .openapi_prefix()
        .map_or_else(|| upper_camel(platform.name()), str::to_owned);

    // Objects.
    let mut objects = BTreeMap::new();
    for object in platform.objects() {
        let name = format!("{prefix}{}", upper_camel(object.name()));
        let name = claim(&mut names.schemas, platform, "schema", name)?;
        let schema = object_schema(template, out, &name, object);
        out.schemas.insert(name.clone(), schema);
        objects.insert(object.name().to_owned(), name);
    }

    // Every operationId first: links name other endpoints'.
    let mut operation_ids = BTreeMap::new();
    for endpoint in platform.endpoints() {
        let id = match endpoint.operation_id() {
            Some(id) => id.to_owned(),
            None => {
                let verb = if endpoint.is_list() { "list" } else { "get" };
                format!("{verb}{prefix}{}", upper_camel(endpoint.name()))
            }
        };
        let id = claim(&mut names.operation_ids, platform, "operationId", id)?;
        operation_ids.insert(endpoint.name(), id);
    }

    // Parameters: a shared one is one component, named and described
    // once; its cursor words name the subjects of every endpoint that
    // reads it.
    let mut shared: BTreeMap<&str, String> = BTreeMap::new();
    let mut references: Vec<Vec<String>> = Vec::new();
    for endpoint in platform.endpoints() {
        let mut refs = Vec::new();
        for param in endpoint.parameters() {
            if let Some(name) = shared.get(param.name()).filter(|_| param.shared()) {
                refs.push(name.clone());
                continue;
            }
            let name = match (param.openapi_name(), param.shared()) {
                (Some(name), _) => name.to_owned(),
                (None, true) => format!("{prefix}{}", upper_camel(param.name())),
                (None, false) => format!(
                    "{prefix}{}{}",
                    upper_camel(endpoint.name()),
                    upper_camel(param.name())
                ),
            };
            let name = claim(&mut names.parameters, platform, "parameter", name)?;
            let subjects: Vec<&str> = if param.shared() {
                shared.insert(param.name(), name.clone());
                let mut subjects: Vec<&str> = Vec::new();
                for e in platform.endpoints() {
                    let reads = e.parameter(param.name()).is_some_and(Parameter::shared);
                    if reads && !subjects.contains(&e.subject().name()) {
                        subjects.push(e.subject().name());
                    }
                }
                subjects
            } else {
                vec![endpoint.subject().name()]
            };
            out.parameters
                .insert(name.clone(), parameter_object(template, param, &subjects));
            refs.push(name);
        }
        references.push(refs);
    }

    // Endpoints: the envelope, the path.
    for (endpoint, refs) in platform.endpoints().iter().zip(&references) {
        let object = &objects[endpoint.answer().object().name()];
        let envelope = format!("{prefix}{}Response", upper_camel(endpoint.name()));
        let envelope = claim(&mut names.schemas, platform, "schema", envelope)?;
        out.schemas.insert(
            envelope.clone(),
            envelope_schema(template, &envelope, object, endpoint.is_list()),
        );
        let operation = operation(
            template,
            platform,
            endpoint,
            &operation_ids,
            refs,
            &envelope,
        )?;
        out.paths.insert(
            format!("/v1/{}/{}", platform.name(), endpoint.name()),
            json!({ "get": operation }),
        );
        if !out.costs.iter().any(|(name, _)| name == endpoint.name()) {
            out.costs
                .push((endpoint.name().to_owned(), endpoint.cost()));
        }
    }

    out.tags.push(json!({
        "name": platform.name(),
        "description": platform.summary(),
    }));
    Ok(())
}

/// The operation `GET /v1/{platform}/{endpoint}`.
fn operation(
    template: &Template,
    platform: &Description,
    endpoint: &Endpoint,
    operation_ids: &BTreeMap<&str, String>,
    parameters: &[String],
    envelope: &str,
) -> Result<Value, DocumentError> {
    let t = &template.operation;
    let id = &operation_ids[endpoint.name()];
    let cost_words = t
        .description_end
        .replace("{cost}", &endpoint.cost().to_string());
    let description = match endpoint.description() {
        Some(words) => format!("{words} {cost_words}"),
        None => cost_words,
    };
    let mut params = t.parameters_before.clone();
    params.extend(
        parameters
            .iter()
            .map(|name| json!({ "$ref": format!("#/components/parameters/{name}") })),
    );
    params.extend(t.parameters_after.iter().cloned());

    let mut headers = t.success_headers.clone();
    if !endpoint.is_list() {
        headers.retain(|name, _| !t.list_only_headers.contains(name));
    }
    let object = endpoint.answer().object();
    let words = spaced(object.name());
    let answer_words = if endpoint.is_list() {
        format!(
            "A page of {}.",
            object
                .plural()
                .map_or_else(|| plural(&words), str::to_owned)
        )
    } else {
        format!("The {words}.")
    };
    let mut success = Map::new();
    success.insert("description".into(), answer_words.into());
    success.insert("headers".into(), Value::Object(headers));
    success.insert(
        "content".into(),
        json!({ "application/json": {
            "schema": { "$ref": format!("#/components/schemas/{envelope}") },
            "example": example(template, platform, endpoint),
        }}),
    );
    let links = links(template, platform, endpoint, operation_ids)?;
    if !links.is_empty() {
        success.insert("links".into(), Value::Object(links));
    }

    let mut responses = Map::new();
    responses.insert("200".into(), Value::Object(success));
    for (status, response) in &t.responses {
        let response = match t.responses_without_not_found.get(status) {
            Some(other) if !endpoint.not_found() => other,
            _ => response,
        };
        responses.insert(status.clone(), response.clone());
    }

    Ok(json!({
        "tags": [platform.name()],
        "operationId": id,
        "summary": endpoint.summary(),
        "description": description,
        "parameters": params,
        "responses": responses,
    }))
}

/// The example of a success: the description's `data` in the envelope. A
/// list's page shows a next cursor unless its count rule says it is the
/// last (exact, and fewer items than the default page size).
fn example(template: &Template, platform: &Description, endpoint: &Endpoint) -> Value {
    let data: Value = serde_json::from_str(endpoint.example().get())
        .expect("an example is JSON: it was checked at load");
    let mut meta = Map::new();
    meta.insert("credits_used".into(), endpoint.cost().into());
    meta.insert("cached".into(), false.into());
    if let Shape::List { count_rule, .. } = endpoint.answer().shape() {
        let items = data.as_array().map_or(0, Vec::len) as u64;
        let last = match (count_rule, endpoint.page_size().map(Parameter::kind)) {
            (CountRule::Exact, Some(ParameterKind::Integer(rule))) => items < rule.default,
            _ => false,
        };
        let cursor = if last {
            Value::Null
        } else {
            template.example_meta.next_cursor.clone().into()
        };
        meta.insert("next_cursor".into(), cursor);
    }
    meta.insert(
        "request_id".into(),
        template.example_meta.request_id.clone().into(),
    );
    json!({
        "success": true,
        "platform": platform.name(),
        "data": data,
        "meta": meta,
    })
}

/// The description's links, then, for a list, the next page.
fn links(
    template: &Template,
    platform: &Description,
    endpoint: &Endpoint,
    operation_ids: &BTreeMap<&str, String>,
) -> Result<Map<String, Value>, DocumentError> {
    let mut links = Map::new();
    let item = if endpoint.is_list() { "/0" } else { "" };
    for link in endpoint.links() {
        let target = platform
            .endpoint(link.endpoint())
            .expect("a link's endpoint is the platform's: checked at load");
        let id = &operation_ids[target.name()];
        links.insert(
            id.clone(),
            json!({
                "operationId": id,
                "description": link.summary(),
                "parameters": {
                    target.subject().name():
                        format!("$response.body#/data{item}/{}", link.field()),
                },
            }),
        );
    }
    if let Some(cursor) = endpoint.cursor() {
        const NEXT: &str = "nextPage";
        if links.contains_key(NEXT) {
            return Err(DocumentError::NameTaken {
                platform: platform.name().to_owned(),
                kind: "link",
                name: NEXT.into(),
            });
        }
        let subject = endpoint.subject().name();
        links.insert(
            NEXT.into(),
            json!({
                "operationId": operation_ids[endpoint.name()],
                "description": template.next_page_link.replace("{cursor}", cursor.name()),
                "parameters": {
                    subject: format!("$request.query.{subject}"),
                    cursor.name(): "$response.body#/meta/next_cursor",
                },
            }),
        );
    }
    Ok(links)
}

/// The success envelope of an endpoint.
fn envelope_schema(template: &Template, title: &str, object: &str, list: bool) -> Value {
    let object = json!({ "$ref": format!("#/components/schemas/{object}") });
    let (data, meta) = if list {
        (
            json!({ "type": "array", "items": object }),
            &template.meta.list,
        )
    } else {
        (object, &template.meta.one)
    };
    json!({
        "title": title,
        "type": "object",
        "properties": {
            "success": { "const": true },
            "platform": template.platform,
            "data": data,
            "meta": meta,
        },
        "required": ["success", "platform", "data", "meta"],
        "additionalProperties": false,
    })
}

/// A query parameter. `subjects`: for a cursor, the subjects of the
/// endpoints that read it.
fn parameter_object(template: &Template, param: &Parameter, subjects: &[&str]) -> Value {
    let mut object = Map::new();
    object.insert("name".into(), param.name().into());
    object.insert("in".into(), "query".into());
    let required = matches!(param.kind(), ParameterKind::String(_));
    object.insert("required".into(), required.into());
    let (schema, words) = match param.kind() {
        ParameterKind::String(rule) => {
            let mut schema = Map::new();
            schema.insert("type".into(), "string".into());
            if rule.nfc() || rule.lowercase() {
                // The rule holds for the value once normalized or
                // lowercased, which can change its characters and length:
                // no schema of what is sent says it exactly.
                schema.insert("minLength".into(), 1.into());
            } else {
                let refusals: Vec<&str> = rule.refusals().iter().map(|(p, _)| p.source()).collect();
                text_constraints(
                    &mut schema,
                    &Text {
                        length: Some(rule.length()),
                        pattern: rule.pattern().map(|p| p.source()),
                        refusals: &refusals,
                        prefix: rule.drop_prefix(),
                        nullable: None,
                    },
                );
            }
            (Value::Object(schema), format!("Must be {}.", rule.rule()))
        }
        ParameterKind::Integer(rule) => (
            json!({
                "type": "integer",
                "minimum": rule.min,
                "maximum": rule.max,
                "default": rule.default,
            }),
            format!(
                "An integer from {} to {}; {} when absent.",
                rule.min, rule.max, rule.default
            ),
        ),
        ParameterKind::Cursor => {
            let end = template
                .cursor_description_end
                .replace("{subjects}", &either(subjects))
                .replace("{cursor}", param.name());
            let words = match param.summary() {
                Some(summary) => format!("{summary} {end}"),
                None => end,
            };
            (json!({ "type": "string" }), words)
        }
    };
    let words = match (param.kind(), param.summary()) {
        (ParameterKind::Cursor, _) | (_, None) => words,
        (_, Some(summary)) => summary.to_owned(),
    };
    object.insert("description".into(), words.into());
    object.insert("schema".into(), schema);
    if let Some(example) = param.example() {
        object.insert("example".into(), example.into());
    }
    if !required {
        // Empty counts as absent: the default, or the first page.
        object.insert("allowEmptyValue".into(), true.into());
    }
    Value::Object(object)
}

/// An object type: every field required, no other allowed.
fn object_schema(
    template: &Template,
    out: &mut Generated,
    title: &str,
    object: &ObjectType,
) -> Value {
    let description = match object.summary() {
        Some(summary) => format!("{summary} {}", template.object_description_end),
        None => template.object_description_end.clone(),
    };
    let mut properties = Map::new();
    for field in object.fields() {
        properties.insert(field.name().to_owned(), field_schema(out, field));
    }
    let required: Vec<&str> = object.fields().iter().map(Field::name).collect();
    json!({
        "title": title,
        "description": description,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn field_schema(out: &mut Generated, field: &Field) -> Value {
    let nullable = field.nullable();
    let of = |kind: &str| -> Value {
        if nullable {
            json!([kind, "null"])
        } else {
            kind.into()
        }
    };
    let mut schema = Map::new();
    match field.kind() {
        FieldType::Integer => {
            schema.insert("type".into(), of("integer"));
            schema.insert("minimum".into(), 0.into());
        }
        FieldType::Boolean => {
            schema.insert("type".into(), of("boolean"));
        }
        FieldType::Id => {
            schema.insert("type".into(), of("string"));
        }
        FieldType::Timestamp => {
            let name = if nullable {
                out.nullable_timestamp = true;
                NULLABLE_TIMESTAMP
            } else {
                out.timestamp = true;
                TIMESTAMP
            };
            schema.insert("$ref".into(), format!("#/components/schemas/{name}").into());
        }
        FieldType::Enum(values) => {
            schema.insert("type".into(), of("string"));
            let mut values: Vec<Value> = values.iter().map(|v| v.as_str().into()).collect();
            if nullable {
                values.push(Value::Null);
            }
            schema.insert("enum".into(), values.into());
        }
        FieldType::String(rule) => {
            schema.insert("type".into(), of("string"));
            let refusals: Vec<&str> = rule.refusals().iter().map(|(p, _)| p.source()).collect();
            let length = match (rule.length(), rule.never_empty()) {
                (Some((least, most)), true) => Some((least.max(1), most)),
                (None, true) => Some((1, usize::MAX)),
                (length, false) => length,
            };
            text_constraints(
                &mut schema,
                &Text {
                    length,
                    pattern: rule.pattern().map(|p| p.source()),
                    refusals: &refusals,
                    prefix: None,
                    nullable: Some(nullable),
                },
            );
            if rule.url() {
                match schema.get("pattern").cloned() {
                    // Both must hold.
                    Some(own) => {
                        schema.remove("pattern");
                        schema.insert(
                            "allOf".into(),
                            json!([{ "pattern": own }, { "pattern": URL_PATTERN }]),
                        );
                    }
                    None => {
                        schema.insert("pattern".into(), URL_PATTERN.into());
                    }
                }
            }
        }
    }
    if let Some(summary) = field.summary() {
        schema.insert("description".into(), summary.into());
    }
    Value::Object(schema)
}

fn timestamp_schema(nullable: bool) -> Value {
    let words =
        "A UTC time with second precision, exactly `YYYY-MM-DDTHH:MM:SSZ` (years 0000-9999)";
    if nullable {
        json!({
            "description": format!("{words}, or `null`."),
            "type": ["string", "null"],
            "format": "date-time",
            "pattern": TIMESTAMP_PATTERN,
            "examples": ["2025-11-21T04:40:00Z", null],
        })
    } else {
        json!({
            "description": format!("{words}."),
            "type": "string",
            "format": "date-time",
            "pattern": TIMESTAMP_PATTERN,
            "examples": ["2025-11-21T04:40:00Z"],
        })
    }
}

/// The rules of a text value, as the description gives them.
struct Text<'a> {
    /// The least and most characters (after dropping the prefix).
    length: Option<(usize, usize)>,
    /// A Rust regular expression the whole value matches.
    pattern: Option<&'a str>,
    /// Rust regular expressions no whole value matches.
    refusals: &'a [&'a str],
    /// Sent before the value, optionally, once.
    prefix: Option<&'a str>,
    /// For a field: whether it may be `null`; `None` for a parameter.
    nullable: Option<bool>,
}

/// Adds `minLength`, `maxLength`, `pattern` and `not` to a string schema.
///
/// Patterns are anchored, and written for the engines OpenAPI tools use
/// (ECMA-262, Python's `re`): Unicode's control class is spelt out as
/// ranges; other syntax is kept as written. A pattern of one ASCII class
/// repeated takes the length into its repetition, so that an optional
/// prefix does not count against it; otherwise, with a prefix, the most
/// characters counts the prefix's too (a value at the most with no prefix
/// passes the schema and is refused).
fn text_constraints(schema: &mut Map<String, Value>, text: &Text) {
    let prefix = match text.prefix {
        Some(p) if p.chars().count() == 1 => format!("{}?", escape(p)),
        Some(p) => format!("(?:{})?", escape(p)),
        None => String::new(),
    };
    let whole = |source: &str| format!("^{prefix}{}$", grouped(&translate(source)));
    let folded = match (text.length, text.pattern.map(translate)) {
        (Some((least, most)), Some(pattern)) if most != usize::MAX => {
            let times = if least == most {
                format!("{{{least}}}")
            } else {
                format!("{{{least},{most}}}")
            };
            one_ascii_class(&pattern).map(|class| format!("^{prefix}{class}{times}$"))
        }
        _ => None,
    };
    match folded {
        Some(pattern) => {
            schema.insert("pattern".into(), pattern.into());
        }
        None => {
            if let Some((least, most)) = text.length {
                if least > 0 {
                    schema.insert("minLength".into(), least.into());
                }
                if most != usize::MAX {
                    let extra = text.prefix.map_or(0, |p| p.chars().count());
                    schema.insert("maxLength".into(), (most + extra).into());
                }
            }
            if let Some(pattern) = text.pattern {
                schema.insert("pattern".into(), whole(pattern).into());
            }
        }
    }
    let refused: Vec<Value> = text
        .refusals
        .iter()
        .map(|source| json!({ "pattern": whole(source) }))
        .collect();
    let mut not = match refused.len() {
        0 => return,
        1 => refused
            .into_iter()
            .next()
            .expect("one")
            .as_object()
            .cloned()
            .expect("an object"),
        _ => {
            let mut not = Map::new();
            not.insert("anyOf".into(), refused.into());
            not
        }
    };
    if text.nullable.is_some() {
        // `pattern` holds for anything not a string: `null` would match.
        not.insert("type".into(), "string".into());
    }
    schema.insert("not".into(), Value::Object(not));
}

/// `source` grouped where an alternation would otherwise escape the
/// anchors.
fn grouped(source: &str) -> String {
    if source.contains('|') {
        format!("(?:{source})")
    } else {
        source.to_owned()
    }
}

/// `[...]` when `pattern` is one class of ASCII characters, without
/// escapes, nesting or set operations, repeated by `+` or `*`.
fn one_ascii_class(pattern: &str) -> Option<&str> {
    let rest = pattern.strip_prefix('[')?;
    let end = rest.find(']')?;
    let (body, repeat) = (&rest[..end], &rest[end + 1..]);
    let plain = !body.is_empty()
        && !body.starts_with('^')
        && body.is_ascii()
        && !body.contains(['[', '\\'])
        && !["&&", "--", "~~"].iter().any(|op| body.contains(op));
    (plain && (repeat == "+" || repeat == "*")).then(|| &pattern[..end + 2])
}

/// A Rust regular expression written for engines without Unicode classes
/// where it names Unicode's control characters (`\p{Cc}`, `\P{Cc}`).
fn translate(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut in_class = false;
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix(r"\p{Cc}") {
            if in_class {
                out.push_str(CONTROLS);
            } else {
                out.push_str(&format!("[{CONTROLS}]"));
            }
            rest = after;
            continue;
        }
        if let Some(after) = rest.strip_prefix(r"\P{Cc}") {
            if in_class {
                // A complement inside a class has no range form.
                out.push_str(r"\P{Cc}");
            } else {
                out.push_str(&format!("[^{CONTROLS}]"));
            }
            rest = after;
            continue;
        }
        if c == '\\' {
            let escaped: String = rest.chars().take(2).collect();
            out.push_str(&escaped);
            rest = &rest[escaped.len()..];
            continue;
        }
        match c {
            '[' => in_class = true,
            ']' => in_class = false,
            _ => {}
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `text` with the characters regular expressions give a meaning escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\^$.|?*+()[]{}/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `a_b-c` as `ABC`: every part's first letter upper case.
fn upper_camel(name: &str) -> String {
    name.split(['_', '-'])
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// `media_item` as `media item`.
fn spaced(name: &str) -> String {
    name.replace('_', " ")
}

/// English plural of the last word: `posts`, `replies`, `boxes`.
fn plural(words: &str) -> String {
    let consonant_y = words.strip_suffix('y').filter(|stem| {
        stem.chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphabetic() && !"aeiou".contains(c))
    });
    if let Some(stem) = consonant_y {
        return format!("{stem}ies");
    }
    if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|end| words.ends_with(end))
    {
        return format!("{words}es");
    }
    format!("{words}s")
}

/// `` `a`, `b` or `c` ``.
fn either(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The `Platform` schema's values: the live platforms.
fn set_platforms(
    base: &mut Value,
    template: &Template,
    platforms: &[&Description],
) -> Result<(), DocumentError> {
    let pointer = template.platform["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix('#'))
        .ok_or_else(|| {
            DocumentError::Base(format!(
                "`{TEMPLATE_KEY}.platform` is no `$ref` in the document"
            ))
        })?;
    let schema = base
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| DocumentError::Base(format!("has no schema at {pointer}")))?;
    match platforms {
        [] => {}
        [one] => {
            schema.insert("const".into(), one.name().into());
        }
        many => {
            let names: Vec<&str> = many.iter().map(|p| p.name()).collect();
            schema.insert("enum".into(), names.into());
        }
    }
    Ok(())
}

/// The account's `costs`: every live endpoint, with its default cost in
/// the example.
fn set_costs(
    base: &mut Value,
    template: &Template,
    costs: &[(String, u32)],
) -> Result<(), DocumentError> {
    let missing = |pointer: &str| DocumentError::Base(format!("has no object at {pointer}"));
    let [schema, example] = &template.costs;
    let object = base
        .pointer_mut(schema)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| missing(schema))?;
    let properties: Map<String, Value> = costs
        .iter()
        .map(|(name, _)| (name.clone(), json!({ "type": "integer", "minimum": 0 })))
        .collect();
    let required: Vec<&str> = costs.iter().map(|(name, _)| name.as_str()).collect();
    object.insert("properties".into(), Value::Object(properties));
    object.insert("required".into(), required.into());
    let values: Map<String, Value> = costs
        .iter()
        .map(|(name, cost)| (name.clone(), (*cost).into()))
        .collect();
    *base.pointer_mut(example).ok_or_else(|| missing(example))? = Value::Object(values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_upper_camel_and_plural() {
        assert_eq!(upper_camel("shortvideo"), "Shortvideo");
        assert_eq!(upper_camel("photo-grid"), "PhotoGrid");
        assert_eq!(upper_camel("min_birds"), "MinBirds");
        assert_eq!(upper_camel("v2_list"), "V2List");
        for (one, many) in [
            ("post", "posts"),
            ("reply", "replies"),
            ("day", "days"),
            ("box", "boxes"),
            ("match", "matches"),
            ("media item", "media items"),
        ] {
            assert_eq!(plural(one), many);
        }
        assert_eq!(either(&["a"]), "`a`");
        assert_eq!(either(&["a", "b"]), "`a` or `b`");
        assert_eq!(either(&["a", "b", "c"]), "`a`, `b` or `c`");
    }

    #[test]
    fn control_classes_are_spelt_out() {
        assert_eq!(translate(r"\P{Cc}*"), r"[^\u0000-\u001F\u007F-\u009F]*");
        assert_eq!(translate(r"\p{Cc}+"), r"[\u0000-\u001F\u007F-\u009F]+");
        assert_eq!(translate(r"[a\p{Cc}]"), r"[a\u0000-\u001F\u007F-\u009F]");
        assert_eq!(translate(r"[a\P{Cc}]"), r"[a\P{Cc}]");
        assert_eq!(translate(r"\\p{Cc}"), r"\\p{Cc}");
        assert_eq!(translate(r"[\p{L}_]+"), r"[\p{L}_]+");
        assert_eq!(translate("é+"), "é+");
    }

    #[test]
    fn one_ascii_class_repeated_takes_the_length() {
        assert_eq!(one_ascii_class("[A-Za-z0-9._]+"), Some("[A-Za-z0-9._]"));
        assert_eq!(one_ascii_class("[0-9]*"), Some("[0-9]"));
        for not in [
            "[^a]+",
            "[a]",
            "[a]+b",
            "[a]{2}",
            r"[\d]+",
            "[é]+",
            "[[:alpha:]]+",
            "[a-z&&[^x]]+",
            "a+",
            "[]+",
        ] {
            assert_eq!(one_ascii_class(not), None, "{not}");
        }
    }

    fn constraints(text: &Text) -> Value {
        let mut schema = Map::new();
        text_constraints(&mut schema, text);
        Value::Object(schema)
    }

    #[test]
    fn text_rules_become_schema_keywords() {
        let text = |length, pattern, prefix| Text {
            length,
            pattern,
            refusals: &[],
            prefix,
            nullable: None,
        };
        assert_eq!(
            constraints(&text(Some((1, 64)), Some("[a-z.]+"), Some("@"))),
            json!({ "pattern": "^@?[a-z.]{1,64}$" })
        );
        assert_eq!(
            constraints(&text(Some((2, 5)), Some("a|b+"), None)),
            json!({ "minLength": 2, "maxLength": 5, "pattern": "^(?:a|b+)$" })
        );
        // The prefix counts towards the most when the length stays apart.
        assert_eq!(
            constraints(&text(Some((1, 5)), Some("[^x]+"), Some("#$"))),
            json!({ "minLength": 1, "maxLength": 7, "pattern": r"^(?:#\$)?[^x]+$" })
        );
        assert_eq!(
            constraints(&text(Some((11, 11)), Some("[A-Z_-]+"), None)),
            json!({ "pattern": "^[A-Z_-]{11}$" })
        );
        assert_eq!(
            constraints(&text(Some((3, 3)), None, None)),
            json!({ "minLength": 3, "maxLength": 3 })
        );
        let refused = Text {
            length: None,
            pattern: None,
            refusals: &[r"\.+", "x"],
            prefix: Some("@"),
            nullable: None,
        };
        assert_eq!(
            constraints(&refused),
            json!({ "not": { "anyOf": [{ "pattern": r"^@?\.+$" }, { "pattern": "^@?x$" }] } })
        );
        let field = Text {
            length: Some((1, usize::MAX)),
            pattern: None,
            refusals: &["x"],
            prefix: None,
            nullable: Some(true),
        };
        assert_eq!(
            constraints(&field),
            json!({ "minLength": 1, "not": { "type": "string", "pattern": "^x$" } })
        );
    }
}
