//! The generated API document: for `shortvideo` it keeps the names of the
//! document the service served before descriptions; with test
//! platforms beside it, it is still a valid OpenAPI 3.1 document whose
//! references resolve, whose schemas compile and whose examples and
//! parameters agree with the descriptions' own checks.

use platform_description::openapi::{self, DocumentError};
use platform_description::{Description, ParameterKind};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn base() -> Value {
    read_json(&repository("openapi/base.json"))
}

fn shortvideo() -> Description {
    Description::load(&repository("platforms/shortvideo.toml"), "shortvideo").unwrap()
}

fn fixture(name: &str) -> Description {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.toml"));
    Description::load(&path, name).unwrap()
}

fn sorted_keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// The generator once made the hand-written document of `shortvideo` value
/// for value (the file has gone since); what its clients rely on stays:
/// the paths, the `operationId`s and the components' names.
#[test]
fn shortvideo_document_keeps_the_names_its_clients_know() {
    let document = openapi::document(base(), &[&shortvideo()]).unwrap();
    assert_eq!(
        sorted_keys(&document["paths"]),
        [
            "/healthz",
            "/readyz",
            "/v1/account",
            "/v1/openapi.json",
            "/v1/shortvideo/comments",
            "/v1/shortvideo/post",
            "/v1/shortvideo/posts",
            "/v1/shortvideo/profile",
            "/v1/shortvideo/search",
        ]
    );
    for (path, id) in [
        ("/v1/shortvideo/profile", "getProfile"),
        ("/v1/shortvideo/posts", "listPosts"),
        ("/v1/shortvideo/post", "getPost"),
        ("/v1/shortvideo/comments", "listComments"),
        ("/v1/shortvideo/search", "searchProfiles"),
        ("/v1/account", "getAccount"),
        ("/healthz", "getHealth"),
        ("/readyz", "getReadiness"),
        ("/v1/openapi.json", "getOpenApiDocument"),
    ] {
        assert_eq!(
            document["paths"][path]["get"]["operationId"],
            json!(id),
            "{path}"
        );
    }
    let components = &document["components"];
    assert_eq!(
        sorted_keys(&components["parameters"]),
        [
            "CacheControl",
            "CommentsCount",
            "Cursor",
            "IfMatch",
            "IfNoneMatch",
            "PostId",
            "PostsCount",
            "Query",
            "RequestId",
            "SearchCount",
            "Username",
        ]
    );
    assert_eq!(
        sorted_keys(&components["schemas"]),
        [
            "Account",
            "AccountMeta",
            "AccountResponse",
            "Comment",
            "CommentsResponse",
            "Error",
            "ErrorCode",
            "ErrorDetail",
            "ErrorMeta",
            "Health",
            "ItemMeta",
            "ListMeta",
            "Meta",
            "NotReady",
            "NullableTimestamp",
            "OpenApiDocument",
            "Platform",
            "Post",
            "PostResponse",
            "PostsResponse",
            "Profile",
            "ProfileResponse",
            "Ready",
            "RequestId",
            "SearchResponse",
        ]
    );
    assert_eq!(
        components["schemas"]["Platform"],
        json!({"description": "The platform path segment.", "type": "string", "const": "shortvideo"})
    );
}

fn meta_schema_errors(document: &Value) -> Vec<String> {
    let meta = read_json(&repository("openapi/meta/schema-3.1.json"));
    let validator = jsonschema::draft202012::options().build(&meta).unwrap();
    validator
        .iter_errors(document)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

const URI: &str = "https://socialgate.invalid/openapi.json";

/// A validator of the schema at `pointer` of `document`.
fn validator(document: &Value, pointer: &str) -> jsonschema::Validator {
    let registry = jsonschema::Registry::new()
        .draft(jsonschema::Draft::Draft202012)
        .add(URI, document.clone())
        .and_then(|b| b.prepare())
        .unwrap();
    jsonschema::draft202012::options()
        .with_registry(&registry)
        .build(&json!({ "$ref": format!("{URI}#{pointer}") }))
        .unwrap_or_else(|e| panic!("#{pointer} does not compile: {e}"))
}

/// Every `$ref` in `value`.
fn references(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r.clone());
            }
            map.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
        _ => {}
    }
}

#[test]
fn with_made_up_platforms_the_document_is_valid_openapi_3_1() {
    let (sv, birdwatch, photogrid) = (shortvideo(), fixture("birdwatch"), fixture("photogrid"));
    let document = openapi::document(base(), &[&sv, &birdwatch, &photogrid]).unwrap();

    let errors = meta_schema_errors(&document);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert!(document.get(openapi::TEMPLATE_KEY).is_none());

    // Every reference resolves, and every component is used.
    let mut refs = Vec::new();
    references(&document, &mut refs);
    for r in &refs {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r}"));
        assert!(document.pointer(pointer).is_some(), "{r} does not resolve");
    }
    for (kind, components) in document["components"].as_object().unwrap() {
        if kind == "securitySchemes" {
            continue;
        }
        for name in components.as_object().unwrap().keys() {
            let r = format!("#/components/{kind}/{name}");
            // The route's 404 is the base's, for paths no platform has.
            let spare = r == "#/components/responses/RouteNotFound";
            assert!(spare || refs.contains(&r), "{r} is never used");
        }
    }

    // Every schema compiles.
    for name in document["components"]["schemas"]
        .as_object()
        .unwrap()
        .keys()
    {
        let schema = &document["components"]["schemas"][name];
        assert!(jsonschema::draft202012::meta::is_valid(schema), "{name}");
        validator(&document, &format!("/components/schemas/{name}"));
    }

    // One operation per endpoint of each platform, with unique ids.
    let mut ids = Vec::new();
    for platform in [&sv, &birdwatch, &photogrid] {
        assert!(document["tags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == platform.name()));
        for endpoint in platform.endpoints() {
            let path = format!("/v1/{}/{}", platform.name(), endpoint.name());
            let op = &document["paths"][&path]["get"];
            ids.push(op["operationId"].as_str().unwrap().to_owned());
            assert_eq!(op["tags"], json!([platform.name()]), "{path}");
        }
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    assert_eq!(
        document["components"]["schemas"]["Platform"]["enum"],
        json!(["shortvideo", "birdwatch", "photogrid"])
    );

    // Words from the description: a plural it gives, a search's 404.
    let answer =
        |path: &str, status: &str| document["paths"][path]["get"]["responses"][status].clone();
    assert_eq!(
        answer("/v1/photogrid/posts", "200")["description"],
        "A page of media."
    );
    assert_eq!(
        answer("/v1/birdwatch/sightings", "200")["description"],
        "A page of sightings."
    );
    assert_eq!(
        answer("/v1/birdwatch/flock", "404")["$ref"],
        "#/components/responses/RouteNotFound"
    );
    assert_eq!(
        answer("/v1/birdwatch/bird", "404")["$ref"],
        "#/components/responses/NotFound"
    );

    // Default names: the platform's name in UpperCamel case first.
    let bird = &document["paths"]["/v1/birdwatch/bird"]["get"];
    assert_eq!(bird["operationId"], "getBirdwatchBird");
    assert_eq!(
        document["paths"]["/v1/birdwatch/sightings"]["get"]["operationId"],
        "listBirdwatchSightings"
    );
    for name in [
        "BirdwatchBird",
        "BirdwatchSighting",
        "BirdwatchSightingsResponse",
    ] {
        assert!(
            document["components"]["schemas"].get(name).is_some(),
            "{name}"
        );
    }
    for name in [
        "BirdwatchRegion",
        "BirdwatchBirdRing",
        "BirdwatchSightingsCount",
        "BirdwatchLeastBirds",
        "BirdwatchCursor",
        "PhotogridUsername",
    ] {
        assert!(
            document["components"]["parameters"].get(name).is_some(),
            "{name}"
        );
    }
}

#[test]
fn examples_validate_against_their_schemas() {
    let (sv, birdwatch, photogrid) = (shortvideo(), fixture("birdwatch"), fixture("photogrid"));
    let document = openapi::document(base(), &[&sv, &birdwatch, &photogrid]).unwrap();
    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (status, response) in item["get"]["responses"].as_object().unwrap() {
            let media = &response["content"]["application/json"];
            let Some(example) = media.get("example") else {
                continue;
            };
            let pointer = format!(
                "/paths/{}/get/responses/{status}/content/application~1json/schema",
                path.replace('/', "~1")
            );
            let errors: Vec<String> = validator(&document, &pointer)
                .iter_errors(example)
                .map(|e| format!("{}: {e}", e.instance_path()))
                .collect();
            assert!(errors.is_empty(), "{path} {status}: {errors:?}");
            checked += 1;
        }
    }
    assert!(checked >= 15, "{checked}");

    // A broken answer does not validate: a field of the wrong type.
    let mut bird = document["paths"]["/v1/birdwatch/bird"]["get"]["responses"]["200"]["content"]
        ["application/json"]["example"]
        .clone();
    bird["data"]["ring"] = json!("EU-0000");
    let pointer = "/components/schemas/BirdwatchBirdResponse";
    assert!(!validator(&document, pointer).is_valid(&bird));
    bird["data"]["ring"] = json!("EU-1234");
    assert!(validator(&document, pointer).is_valid(&bird));
    bird["data"]["note"] = json!("");
    assert!(!validator(&document, pointer).is_valid(&bird));
}

/// Values a string parameter's schema is tried with.
fn candidates(example: Option<&str>) -> Vec<String> {
    let mut values: Vec<String> = [
        "",
        "a",
        "A",
        "@a",
        "@",
        "@@a",
        ".",
        "..",
        "@..",
        "a.b",
        "_",
        "#a",
        "#",
        "0",
        "7312345678901234567",
        "123456789012345678901",
        "EU-1234",
        "EU-0000",
        "eu-1234",
        "a b",
        "a\u{7}",
        "a\u{85}",
        "é",
        "陶芸",
        "#Camargue",
        "a-b",
        "CxYz123_-Ab",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for n in [19, 20, 21, 29, 30, 31, 63, 64, 65, 99, 100, 101] {
        values.push("a".repeat(n));
        values.push(format!("@{}", "a".repeat(n)));
        values.push("7".repeat(n));
    }
    values.extend(example.map(str::to_owned));
    values
}

#[test]
fn parameter_schemas_take_what_the_description_takes() {
    let (sv, birdwatch, photogrid) = (shortvideo(), fixture("birdwatch"), fixture("photogrid"));
    let document = openapi::document(base(), &[&sv, &birdwatch, &photogrid]).unwrap();
    let mut compared = 0;
    for platform in [&sv, &birdwatch, &photogrid] {
        for endpoint in platform.endpoints() {
            let path = format!("/v1/{}/{}", platform.name(), endpoint.name());
            let params = document["paths"][&path]["get"]["parameters"]
                .as_array()
                .unwrap();
            for param in endpoint.parameters() {
                let r = params
                    .iter()
                    .filter_map(|p| p["$ref"].as_str())
                    .find(|r| {
                        let pointer = r.strip_prefix('#').unwrap();
                        document.pointer(pointer).unwrap()["name"] == param.name()
                    })
                    .unwrap_or_else(|| panic!("{path} lists no {}", param.name()));
                let schema = validator(&document, &format!("{}/schema", &r[1..]));
                let ParameterKind::String(rule) = param.kind() else {
                    continue;
                };
                // The others are read with the subject's valid example.
                let others: Vec<(&str, &str)> = endpoint
                    .parameters()
                    .iter()
                    .filter(|p| p.name() != param.name())
                    .filter_map(|p| p.example().map(|e| (p.name(), e)))
                    .collect();
                for value in candidates(param.example()) {
                    let mut query = others.clone();
                    query.push((param.name(), value.as_str()));
                    let taken = endpoint.validate(query).is_ok();
                    let valid = schema.is_valid(&json!(value));
                    if rule.nfc() || rule.lowercase() {
                        // Given loosely: never refuses what is taken.
                        assert!(valid || !taken, "{path} {}={value:?}", param.name());
                    } else if rule.drop_prefix().is_none() || one_class(rule) {
                        assert_eq!(valid, taken, "{path} {}={value:?}", param.name());
                    } else {
                        assert!(valid || !taken, "{path} {}={value:?}", param.name());
                    }
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 500, "{compared}");
}

/// Whether the rule's pattern is one class repeated: the schema is then
/// exact even with a prefix.
fn one_class(rule: &platform_description::StringRule) -> bool {
    rule.pattern().is_some_and(|p| {
        let s = p.source();
        s.starts_with('[')
            && (s.ends_with("]+") || s.ends_with("]*"))
            && s.matches('[').count() == 1
    })
}

#[test]
fn names_given_twice_are_refused() {
    let sv = shortvideo();
    assert_eq!(
        openapi::document(base(), &[&sv, &sv]).unwrap_err(),
        DocumentError::PlatformTwice("shortvideo".into())
    );

    // Another platform that leaves its names unprefixed collides.
    let text = std::fs::read_to_string(repository("platforms/shortvideo.toml"))
        .unwrap()
        .replace("name = \"shortvideo\"", "name = \"shortvideo-two\"");
    let twin = Description::parse(&text, Path::new("twin.toml"), "shortvideo-two").unwrap();
    let err = openapi::document(base(), &[&sv, &twin]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "platform \"shortvideo-two\": the schema \"Profile\" is already another's in the document"
    );

    // With a prefix of its own it does not; its explicit names still do.
    let prefixed = text.replace("openapi_prefix = \"\"", "openapi_prefix = \"Two\"");
    let twin = Description::parse(&prefixed, Path::new("twin.toml"), "shortvideo-two").unwrap();
    let err = openapi::document(base(), &[&sv, &twin]).unwrap_err();
    assert!(
        matches!(&err, DocumentError::NameTaken { kind: "operationId", name, .. } if name == "getProfile"),
        "{err}"
    );

    // A platform's name may not take the base's.
    let clash = prefixed
        .replace("operation_id = \"", "operation_id = \"two")
        .replace("openapi_name = \"PostId\"", "openapi_name = \"RequestId\"");
    let twin = Description::parse(&clash, Path::new("twin.toml"), "shortvideo-two").unwrap();
    let err = openapi::document(base(), &[&sv, &twin]).unwrap_err();
    assert!(
        matches!(&err, DocumentError::NameTaken { kind: "parameter", name, .. } if name == "RequestId"),
        "{err}"
    );
    let fine = clash
        .replace(
            "openapi_name = \"RequestId\"",
            "openapi_name = \"TwoPostId\"",
        )
        .replace("openapi_name = \"Query\"", "openapi_name = \"TwoQuery\"");
    let twin = Description::parse(&fine, Path::new("twin.toml"), "shortvideo-two").unwrap();
    let document = openapi::document(base(), &[&sv, &twin]).unwrap();
    assert!(document["components"]["schemas"]
        .get("TwoProfile")
        .is_some());
    assert_eq!(
        document["paths"]["/v1/shortvideo-two/profile"]["get"]["operationId"],
        "twogetProfile"
    );
}

#[test]
fn a_base_without_the_template_is_refused() {
    let mut base = base();
    base.as_object_mut().unwrap().remove(openapi::TEMPLATE_KEY);
    let err = openapi::document(base, &[&shortvideo()]).unwrap_err();
    assert_eq!(err.to_string(), "the base document has no `x-platforms`");
}

#[test]
fn no_platform_leaves_the_base_serving_its_own_paths() {
    let document = openapi::document(base(), &[]).unwrap();
    let errors = meta_schema_errors(&document);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let paths: Vec<&String> = document["paths"].as_object().unwrap().keys().collect();
    assert_eq!(
        paths,
        ["/healthz", "/readyz", "/v1/account", "/v1/openapi.json"]
    );
}
