//! Loading: the shipped description and the test platforms load as
//! written, and every bad file is refused with its file, place and reason.

use platform_description::{CountRule, Description, FieldType, LoadError, ParameterKind, Shape};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn shortvideo() -> Description {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../platforms/shortvideo.toml");
    Description::load(&path, "shortvideo").unwrap()
}

#[test]
fn shortvideo_is_described_as_it_is_served() {
    let d = shortvideo();
    assert_eq!(d.version(), "1.0");
    assert_eq!(d.name(), "shortvideo");
    let served: Vec<_> = d
        .endpoints()
        .iter()
        .map(|e| {
            let list = match e.answer().shape() {
                Shape::One => None,
                Shape::List { count_rule, .. } => Some(*count_rule),
            };
            (
                e.name(),
                e.subject().name(),
                e.answer().object().name(),
                list,
                e.cache_ttl_s(),
                e.cost(),
                e.operation_id().unwrap(),
            )
        })
        .collect();
    // TTLs and costs are the host's defaults today; the count rules are
    // plugin-api's `Call::most_items`.
    assert_eq!(
        served,
        [
            ("profile", "username", "profile", None, 300, 1, "getProfile"),
            (
                "posts",
                "username",
                "post",
                Some(CountRule::AtMost { extra: 4 }),
                120,
                1,
                "listPosts"
            ),
            ("post", "id", "post", None, 300, 1, "getPost"),
            (
                "comments",
                "id",
                "comment",
                Some(CountRule::Exact),
                120,
                1,
                "listComments"
            ),
            (
                "search",
                "query",
                "profile",
                Some(CountRule::AtMost { extra: 0 }),
                600,
                1,
                "searchProfiles"
            ),
        ]
    );
    let counts: Vec<_> = d
        .endpoints()
        .iter()
        .filter_map(|e| match e.page_size()?.kind() {
            ParameterKind::Integer(rule) => Some((e.name(), rule.min, rule.max, rule.default)),
            _ => None,
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("posts", 1, 30, 10),
            ("comments", 1, 200, 20),
            ("search", 1, 30, 10)
        ]
    );
    for e in d.endpoints() {
        let names: Vec<_> = e.parameters().iter().map(|p| p.name()).collect();
        let expected: &[&str] = match e.is_list() {
            true => &[e.subject().name(), "count", "cursor"],
            false => &[e.subject().name()],
        };
        assert_eq!(names, expected, "{}", e.name());
    }
}

#[test]
fn shortvideo_objects_have_todays_fields_in_order() {
    let d = shortvideo();
    let fields = |object: &str| -> Vec<(String, &'static str, bool)> {
        d.object(object)
            .unwrap()
            .fields()
            .iter()
            .map(|f| {
                let kind = match f.kind() {
                    FieldType::String(_) => "string",
                    FieldType::Integer => "integer",
                    FieldType::Boolean => "boolean",
                    FieldType::Timestamp => "timestamp",
                    FieldType::Enum(_) => "enum",
                    FieldType::Id => "id",
                };
                (f.name().to_owned(), kind, f.nullable())
            })
            .collect()
    };
    let expect = |list: &[(&str, &'static str, bool)]| -> Vec<(String, &'static str, bool)> {
        list.iter()
            .map(|(n, k, o)| (n.to_string(), *k, *o))
            .collect()
    };
    assert_eq!(
        fields("profile"),
        expect(&[
            ("username", "string", false),
            ("display_name", "string", false),
            ("followers", "integer", false),
            ("verified", "boolean", false),
            ("id", "id", true),
            ("bio", "string", true),
            ("following", "integer", true),
            ("likes", "integer", true),
            ("videos", "integer", true),
            ("avatar_url", "string", true),
        ])
    );
    assert_eq!(
        fields("post"),
        expect(&[
            ("id", "id", false),
            ("text", "string", false),
            ("likes", "integer", false),
            ("comments", "integer", false),
            ("views", "integer", true),
            ("shares", "integer", true),
            ("created_at", "timestamp", true),
            ("duration_ms", "integer", true),
            ("author", "string", true),
        ])
    );
    assert_eq!(
        fields("comment"),
        expect(&[
            ("id", "id", false),
            ("text", "string", false),
            ("likes", "integer", false),
            ("replies", "integer", true),
            ("created_at", "timestamp", true),
            ("author", "string", true),
        ])
    );
    assert_eq!(d.objects().len(), 3);
}

#[test]
fn shortvideo_examples_are_kept_as_written() {
    let d = shortvideo();
    let profile = d.endpoint("profile").unwrap().example().get();
    // Key order is the file's, as the API document shows it.
    assert!(
        profile.starts_with(r#"{"username": "lunabakes", "display_name": "Luna Bakes 🍰""#),
        "{profile}"
    );
    let search: serde_json::Value =
        serde_json::from_str(d.endpoint("search").unwrap().example().get()).unwrap();
    assert_eq!(search[0]["bio"], serde_json::Value::Null);
}

#[test]
fn the_test_platforms_load() {
    let birdwatch = Description::load(&fixture("birdwatch.toml"), "birdwatch").unwrap();
    let names: Vec<_> = birdwatch.endpoints().iter().map(|e| e.name()).collect();
    assert_eq!(names, ["bird", "sightings", "flock"]);
    let bird = birdwatch.object("bird").unwrap();
    let kinds: Vec<_> = bird
        .fields()
        .iter()
        .map(|f| std::mem::discriminant(f.kind()))
        .collect();
    for kind in [
        FieldType::Integer,
        FieldType::Boolean,
        FieldType::Timestamp,
        FieldType::Id,
        FieldType::Enum(vec![]),
    ] {
        assert!(kinds.contains(&std::mem::discriminant(&kind)));
    }
    Description::load(&fixture("tiny.toml"), "tiny").unwrap();
    Description::load(&fixture("photogrid.toml"), "photogrid").unwrap();
}

/// A bad file's header says where and why it is refused:
/// `# place: ...` and `# reason: ...`.
fn expected(text: &str, key: &str) -> String {
    let prefix = format!("# {key}: ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line"))
        .to_owned()
}

#[test]
fn every_bad_file_is_refused_with_its_place_and_reason() {
    let mut paths: Vec<_> = std::fs::read_dir(fixture("bad"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let mut wrong = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let (place, reason) = (expected(&text, "place"), expected(&text, "reason"));
        let shown = match Description::load(path, "tiny") {
            Ok(_) => {
                wrong.push(format!("{}: loaded", path.display()));
                continue;
            }
            Err(err) if err.place() != Some(place.as_str()) => {
                wrong.push(format!("{err}\n  should be at: {place}"));
                continue;
            }
            Err(err) => err.to_string(),
        };
        let start = format!("{}: {place}: ", path.display());
        if !shown.starts_with(&start) || !shown.contains(&reason) || shown.contains('\n') {
            wrong.push(format!("{shown}\n  should say, on one line: {reason}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(paths.len() >= 60, "{} bad files", paths.len());
}

#[test]
fn a_later_major_version_is_refused_for_its_version() {
    let err = Description::load(&fixture("bad/version_2.toml"), "tiny").unwrap_err();
    assert!(matches!(err, LoadError::Version { .. }), "{err:?}");
    let err = Description::load(&fixture("bad/not_toml.toml"), "tiny").unwrap_err();
    assert!(matches!(err, LoadError::Malformed { .. }), "{err:?}");
    let err = Description::load(&fixture("bad/default_outside.toml"), "tiny").unwrap_err();
    assert!(matches!(err, LoadError::Invalid { .. }), "{err:?}");
}

#[test]
fn a_later_minor_version_is_read() {
    let text = std::fs::read_to_string(fixture("tiny.toml"))
        .unwrap()
        .replace("version = \"1.0\"", "version = \"1.7\"");
    let d = Description::parse(&text, Path::new("tiny.toml"), "tiny").unwrap();
    assert_eq!(d.version(), "1.7");
}

#[test]
fn a_missing_file_is_unreadable() {
    let err = Description::load(&fixture("none.toml"), "none").unwrap_err();
    assert!(matches!(err, LoadError::Unreadable { .. }), "{err:?}");
    assert_eq!(err.place(), None);
    assert!(
        err.to_string().contains("none.toml: cannot be read"),
        "{err}"
    );
}

#[test]
fn the_documented_example_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/platforms.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let start = page.find("```toml\n").unwrap() + "```toml\n".len();
    let example = &page[start..start + page[start..].find("```").unwrap()];
    let d = Description::parse(example, &path, "tiny").unwrap();
    let friends = d.endpoint("friends").unwrap();
    assert_eq!(
        friends
            .validate([("handle", "@ann"), ("count", "21")])
            .unwrap_err()
            .to_string(),
        "parameter `count` must be an integer from 1 to 20"
    );
}

#[test]
fn names_and_links_for_the_api_document_are_read() {
    let d = shortvideo();
    assert_eq!(d.openapi_prefix(), Some(""));
    let posts = d.endpoint("posts").unwrap();
    let username = posts.parameter("username").unwrap();
    assert!(username.shared() && username.openapi_name().is_none());
    let count = posts.parameter("count").unwrap();
    assert!(!count.shared() && count.openapi_name().is_none());
    let id = d.endpoint("post").unwrap().parameter("id").unwrap();
    assert_eq!((id.shared(), id.openapi_name()), (true, Some("PostId")));
    let links: Vec<_> = d
        .endpoints()
        .iter()
        .flat_map(|e| {
            e.links()
                .iter()
                .map(move |l| (e.name(), l.endpoint(), l.field()))
        })
        .collect();
    let searches: Vec<_> = d
        .endpoints()
        .iter()
        .filter(|e| !e.not_found())
        .map(|e| e.name())
        .collect();
    assert_eq!(searches, ["search"]);
    assert_eq!(
        links,
        [
            ("profile", "posts", "username"),
            ("posts", "post", "id"),
            ("post", "comments", "id"),
            ("search", "profile", "username"),
        ]
    );

    // A link to an endpoint later in the file takes its subject's name as
    // the field; a field can be named instead.
    let birdwatch = Description::load(&fixture("birdwatch.toml"), "birdwatch").unwrap();
    assert_eq!(birdwatch.openapi_prefix(), None);
    let sightings = birdwatch.endpoint("sightings").unwrap();
    assert_eq!(
        (
            sightings.links()[0].endpoint(),
            sightings.links()[0].field()
        ),
        ("bird", "ring")
    );
    assert_eq!(birdwatch.object("bird").unwrap().plural(), None);
}
