//! The OpenAPI document (generated from `openapi/base.json` and
//! `platforms/shortvideo.toml`, as the server makes it) as a contract that answers
//! are checked against: [`Contract::check`] finds the response the document
//! describes for a path, a method and a status, validates the body against
//! its schema (JSON Schema draft 2020-12) and the headers it requires, and
//! remembers what was exercised, so a test can fail when a documented
//! status or error code was never seen.
//!
//! Validation is offline: `jsonschema` is built without its resolving
//! features, and the document itself is the only registered resource.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use jsonschema::{Draft, Registry, Validator};
use serde_json::{json, Value};

use crate::api::Answer;

/// The URI the document is registered under; never fetched.
pub const DOCUMENT_URI: &str = "https://socialgate.invalid/openapi.json";

/// The document a server serving the repository's `shortvideo` makes:
/// `openapi/base.json` with `platforms/shortvideo.toml`.
pub fn generated() -> Value {
    let base = read_json(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi/base.json"));
    let shortvideo = platform_description::Description::load(
        &crate::paths::description("shortvideo"),
        "shortvideo",
    )
    .unwrap_or_else(|e| panic!("the repository's shortvideo description: {e}"));
    platform_description::openapi::document(base, &[&shortvideo])
        .unwrap_or_else(|e| panic!("cannot make the API document: {e}"))
}

/// `openapi/meta/schema-3.1.json`, the official OpenAPI 3.1 meta-schema.
pub fn meta_schema_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi/meta/schema-3.1.json")
}

fn read_json(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The errors of `document` against the OpenAPI 3.1 meta-schema (draft
/// 2020-12), one line each; empty when it validates.
pub fn meta_schema_errors(document: &Value) -> Vec<String> {
    let meta = read_json(&meta_schema_path());
    let validator = jsonschema::draft202012::options()
        .build(&meta)
        .unwrap_or_else(|e| panic!("the OpenAPI meta-schema does not compile: {e}"));
    validator
        .iter_errors(document)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Escapes one JSON pointer segment.
pub fn pointer_segment(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// What [`Contract::check`] saw.
#[derive(Debug, Default)]
struct Seen {
    /// (path, status) of documented operations answered.
    statuses: BTreeSet<(String, String)>,
    /// Error codes answered, with the statuses they came with.
    codes: BTreeMap<String, BTreeSet<u16>>,
    /// Answers checked.
    answers: usize,
}

/// The document with its schemas compiled on demand.
pub struct Contract {
    document: Value,
    registry: Registry<'static>,
    validators: Mutex<HashMap<String, std::sync::Arc<Validator>>>,
    seen: Mutex<Seen>,
}

impl Contract {
    /// The document of the repository's `shortvideo` ([`generated`]).
    pub fn load() -> Contract {
        Contract::new(generated())
    }

    /// A contract of any document (tests of the checker itself).
    pub fn new(document: Value) -> Contract {
        let registry = Registry::new()
            .draft(Draft::Draft202012)
            .add(DOCUMENT_URI, document.clone())
            .and_then(|b| b.prepare())
            .unwrap_or_else(|e| panic!("cannot register the OpenAPI document: {e}"));
        Contract {
            document,
            registry,
            validators: Mutex::new(HashMap::new()),
            seen: Mutex::new(Seen::default()),
        }
    }

    pub fn document(&self) -> &Value {
        &self.document
    }

    /// The value at a JSON pointer of the document, following a `$ref` to
    /// `#/...` at that place (and at the places it leads to).
    fn resolve(&self, pointer: &str) -> Option<(String, &Value)> {
        let mut pointer = pointer.to_owned();
        for _ in 0..8 {
            let value = self.document.pointer(&pointer)?;
            match value.get("$ref").and_then(Value::as_str) {
                Some(target) => pointer = target.strip_prefix('#')?.to_owned(),
                None => return Some((pointer, value)),
            }
        }
        None
    }

    /// A validator for the schema at `pointer` (a JSON pointer of the document).
    pub fn validator(&self, pointer: &str) -> std::sync::Arc<Validator> {
        let mut cache = self.validators.lock().expect("not poisoned");
        if let Some(v) = cache.get(pointer) {
            return v.clone();
        }
        let schema = json!({ "$ref": format!("{DOCUMENT_URI}#{pointer}") });
        let validator = jsonschema::draft202012::options()
            .with_registry(&self.registry)
            .build(&schema)
            .unwrap_or_else(|e| panic!("the schema at #{pointer} does not compile: {e}"));
        let validator = std::sync::Arc::new(validator);
        cache.insert(pointer.to_owned(), validator.clone());
        validator
    }

    /// The errors of `instance` against the schema at `pointer`.
    pub fn errors(&self, pointer: &str, instance: &Value) -> Vec<String> {
        self.validator(pointer)
            .iter_errors(instance)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect()
    }

    /// Every (path, method) operation of the document, methods lower case.
    pub fn operations(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, item) in self.document["paths"].as_object().into_iter().flatten() {
            for method in [
                "get", "put", "post", "delete", "options", "head", "patch", "trace",
            ] {
                if item.get(method).is_some() {
                    out.push((path.clone(), method.to_owned()));
                }
            }
        }
        out
    }

    /// Every (path, status) the document lists, statuses as written.
    pub fn documented_statuses(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, method) in self.operations() {
            let responses = &self.document["paths"][&path][&method]["responses"];
            for status in responses.as_object().into_iter().flatten().map(|(s, _)| s) {
                out.insert((path.clone(), status.clone()));
            }
        }
        out
    }

    /// The `ErrorCode` enum of the document.
    pub fn error_codes(&self) -> Vec<String> {
        self.document["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("components/schemas/ErrorCode has an enum")
            .iter()
            .map(|c| c.as_str().expect("codes are strings").to_owned())
            .collect()
    }

    /// The pointer of the response the document gives for `path`, `method`
    /// and `status`. A 405 to a method the path has no operation for is
    /// looked up under `get`, where the document lists it.
    fn response_pointer(&self, path: &str, method: &str, status: u16) -> Result<String, String> {
        let item = self.document["paths"]
            .get(path)
            .ok_or_else(|| format!("the document has no path `{path}`"))?;
        let mut method = method.to_ascii_lowercase();
        if item.get(&method).is_none() && status == 405 {
            method = "get".into();
        }
        if item.get(&method).is_none() {
            return Err(format!(
                "the document has no `{method}` operation on `{path}`"
            ));
        }
        let pointer = format!(
            "/paths/{}/{method}/responses/{status}",
            pointer_segment(path)
        );
        self.resolve(&pointer)
            .map(|(p, _)| p)
            .ok_or_else(|| format!("the document lists no {status} answer for {method} {path}"))
    }

    /// Checks `answer` to `method path` (a path with its query) against the
    /// document; panics with every difference.
    pub fn check(&self, method: &str, path: &str, answer: &Answer) {
        let bare = path.split('?').next().unwrap_or(path);
        let pointer = self
            .response_pointer(bare, method, answer.status)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {answer:?}"));
        self.check_response(&format!("{method} {path}"), &pointer, answer);
        let mut seen = self.seen.lock().expect("not poisoned");
        seen.statuses
            .insert((bare.to_owned(), answer.status.to_string()));
    }

    /// Checks `answer` (to a path the document does not list, such as an
    /// unknown platform) against the response component `name`, e.g.
    /// `RouteNotFound`.
    pub fn check_as(&self, what: &str, name: &str, answer: &Answer) {
        let pointer = format!("/components/responses/{}", pointer_segment(name));
        assert!(
            self.document.pointer(&pointer).is_some(),
            "the document has no response component `{name}`"
        );
        self.check_response(what, &pointer, answer);
    }

    fn check_response(&self, what: &str, pointer: &str, answer: &Answer) {
        let response = self.document.pointer(pointer).expect("resolved already");
        let mut problems = Vec::new();

        let media = &response["content"]["application/json"];
        if response.get("content").is_none() {
            if !answer.text.is_empty() {
                problems.push(format!(
                    "#{pointer} describes no content, the answer has a body"
                ));
            }
        } else if media.is_null() {
            problems.push(format!("#{pointer} describes no application/json content"));
        } else {
            let content_type = answer.header("content-type").unwrap_or("");
            if !content_type.starts_with("application/json") {
                problems.push(format!("content-type is {content_type:?}"));
            }
            if answer.json.is_null() {
                problems.push("the body is not JSON".into());
            } else {
                let schema = format!("{pointer}/content/application~1json/schema");
                for e in self.errors(&schema, &answer.json) {
                    problems.push(format!("body {e}"));
                }
            }
        }

        // The codes a status carries are its response's examples.
        if let Some(code) = answer.json["error"]["code"].as_str() {
            let codes = self.example_codes(pointer);
            if !codes.iter().any(|c| c == code) {
                problems.push(format!(
                    "code {code} is not among the response's examples {codes:?}"
                ));
            }
        }

        let headers = response["headers"].as_object().cloned().unwrap_or_default();
        for (name, _) in headers {
            let header_pointer = format!("{pointer}/headers/{}", pointer_segment(&name));
            let (header_pointer, header) =
                self.resolve(&header_pointer).expect("a header resolves");
            let value = answer.header(&name);
            let required = header["required"].as_bool().unwrap_or(false);
            match value {
                None if required => problems.push(format!("required header `{name}` is missing")),
                None => {}
                Some(value) => {
                    let schema_pointer = format!("{header_pointer}/schema");
                    let (_, schema) = self.resolve(&schema_pointer).expect("a schema resolves");
                    // Header values are text; an integer header is checked as
                    // the integer its digits spell.
                    let instance = if schema["type"] == "integer" {
                        match value.parse::<i64>() {
                            Ok(n) => json!(n),
                            Err(_) => json!(value),
                        }
                    } else {
                        json!(value)
                    };
                    for e in self.errors(&schema_pointer, &instance) {
                        problems.push(format!("header `{name}: {value}`: {e}"));
                    }
                }
            }
        }

        assert!(
            problems.is_empty(),
            "{what}: the answer does not match #{pointer} of the OpenAPI document:\n  {}\n{answer:?}",
            problems.join("\n  ")
        );

        let mut seen = self.seen.lock().expect("not poisoned");
        seen.answers += 1;
        if let Some(code) = answer.json["error"]["code"].as_str() {
            seen.codes
                .entry(code.to_owned())
                .or_default()
                .insert(answer.status);
        }
    }

    /// What is wrong with the query of `method path` by the operation's
    /// query parameters: a required one missing (an empty value counts as
    /// missing), or a value its schema refuses (an integer schema is given
    /// the integer the digits spell). Empty when the document accepts it.
    pub fn parameter_errors(&self, method: &str, path: &str) -> Vec<String> {
        let (bare, query) = path.split_once('?').unwrap_or((path, ""));
        let method = method.to_ascii_lowercase();
        let operation = format!("/paths/{}/{method}", pointer_segment(bare));
        let Some((_, op)) = self.resolve(&operation) else {
            return vec![format!("the document has no {method} {bare}")];
        };
        let pairs: Vec<(String, String)> = form_pairs(query);
        let mut errors = Vec::new();
        let count = op["parameters"].as_array().map_or(0, Vec::len);
        for i in 0..count {
            let (pointer, param) = self
                .resolve(&format!("{operation}/parameters/{i}"))
                .expect("a parameter resolves");
            if param["in"] != "query" {
                continue;
            }
            let name = param["name"].as_str().expect("a parameter has a name");
            let value = pairs
                .iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.as_str());
            let Some(value) = value else {
                if param["required"] == true {
                    errors.push(format!("`{name}` is required"));
                }
                continue;
            };
            let schema_pointer = format!("{pointer}/schema");
            let (_, schema) = self.resolve(&schema_pointer).expect("a schema resolves");
            let instance = if schema["type"] == "integer" {
                value
                    .parse::<i64>()
                    .map_or_else(|_| json!(value), |n| json!(n))
            } else {
                json!(value)
            };
            for e in self.errors(&schema_pointer, &instance) {
                errors.push(format!("`{name}={value}`: {e}"));
            }
        }
        errors
    }

    /// The error codes of the examples of the response at `pointer`.
    pub fn example_codes(&self, pointer: &str) -> Vec<String> {
        let examples = &self.document.pointer(pointer).expect("a response")["content"]
            ["application/json"]["examples"];
        examples
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, e)| e["value"]["error"]["code"].as_str())
            .map(str::to_owned)
            .collect()
    }

    /// How many answers were checked.
    pub fn answers_checked(&self) -> usize {
        self.seen.lock().expect("not poisoned").answers
    }

    /// Error codes seen in checked answers, with their statuses.
    pub fn codes_seen(&self) -> BTreeMap<String, BTreeSet<u16>> {
        self.seen.lock().expect("not poisoned").codes.clone()
    }

    /// Documented (path, status) pairs never answered, except statuses in
    /// `except`.
    pub fn statuses_not_seen(&self, except: &[&str]) -> Vec<(String, String)> {
        let seen = self.seen.lock().expect("not poisoned");
        self.documented_statuses()
            .into_iter()
            .filter(|(_, status)| !except.contains(&status.as_str()))
            .filter(|pair| !seen.statuses.contains(pair))
            .collect()
    }
}

/// The decoded `name=value` pairs of a query string.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    let url = reqwest::Url::parse(&format!("http://query.invalid/?{query}"))
        .expect("any query makes a URL");
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}
