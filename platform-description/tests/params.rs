//! Parameter validation: for shortvideo, exactly what plugin-api's
//! `Call::from_params` answers today, on the same inputs; for the test
//! platforms, the rules only a description can give (a pattern of its own,
//! a refusal in its own words, NFC and lowercasing, a dropped prefix).

use platform_description::{Description, ParamError, Value};
use plugin_api::{Call, Endpoint};
use std::path::Path;

fn load(path: &str, name: &str) -> Description {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    Description::load(&path, name).unwrap()
}

fn shortvideo() -> Description {
    load("../platforms/shortvideo.toml", "shortvideo")
}

/// What today's rules answer: the subject and page size, or the refused
/// parameter's name and the message.
type Outcome = Result<(String, Option<u64>), (String, String)>;

fn today(endpoint: &str, query: &[(&str, &str)]) -> Outcome {
    let endpoint = Endpoint::from_segment(endpoint).unwrap();
    Call::from_params(endpoint, query.iter().copied())
        .map(|call| (call.subject().to_owned(), call.count().map(u64::from)))
        .map_err(|e| (e.name.to_owned(), e.to_string()))
}

fn described(d: &Description, endpoint: &str, query: &[(&str, &str)]) -> Outcome {
    d.endpoint(endpoint)
        .unwrap()
        .validate(query.iter().copied())
        .map(|v| (v.subject().to_owned(), v.page_size()))
        .map_err(|e| (e.name().to_owned(), e.to_string()))
}

/// Every query worth asking: call.rs's test inputs and their edges, each
/// subject value with each count, and the repeated and unknown parameters.
fn queries() -> Vec<(&'static str, Vec<(String, String)>)> {
    let long = |s: &str, n: usize| s.repeat(n);
    let usernames = vec![
        "@luna.bakes_1".to_owned(),
        ".a".into(),
        "a..".into(),
        "_.".into(),
        "._".into(),
        "@@luna".into(),
        "luna bakes".into(),
        "lüna".into(),
        "luna-bakes".into(),
        "LUNA".into(),
        "@".into(),
        "".into(),
        ".".into(),
        "..".into(),
        "@..".into(),
        "....".into(),
        "a\u{0}".into(),
        long("a", 64),
        long("a", 65),
        format!("@{}", long("a", 64)),
        long(".", 64),
        long(".", 65),
    ];
    let ids = vec![
        "99999999999999999999".to_owned(),
        "18446744073709551616".into(),
        "0".into(),
        "".into(),
        "12a".into(),
        "-1".into(),
        "+1".into(),
        " 1".into(),
        "١٢".into(),
        "123456789012345678901".into(),
    ];
    let queries = vec![
        "x".to_owned(),
        "luna bakes".into(),
        " ".into(),
        "a\tb".into(),
        "a\u{7f}".into(),
        "a\u{85}b".into(),
        "a\u{2028}b".into(),
        long("🥐", 100),
        long("🥐", 101),
        long("a", 100),
        long("a", 101),
        "".into(),
    ];
    let counts: Vec<Option<&str>> = vec![
        None,
        Some(""),
        Some("0"),
        Some("1"),
        Some("10"),
        Some("30"),
        Some("31"),
        Some("200"),
        Some("201"),
        Some("2.5"),
        Some("+3"),
        Some("-1"),
        Some(" 5"),
        Some("٣"),
        Some("abc"),
        Some("99999999999"),
        Some("99999999999999999999999"),
    ];
    let mut out = Vec::new();
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    for (endpoint, subject, values) in [
        ("profile", "username", &usernames),
        ("posts", "username", &usernames),
        ("post", "id", &ids),
        ("comments", "id", &ids),
        ("search", "query", &queries),
    ] {
        for value in values {
            for count in &counts {
                let mut query = vec![pair(subject, value)];
                query.extend(count.map(|c| pair("count", c)));
                out.push((endpoint, query));
            }
        }
        let good = values[0].as_str();
        for query in [
            vec![],
            vec![pair(subject, good), pair(subject, good)],
            vec![pair(subject, good), pair(subject, "")],
            vec![pair(subject, ""), pair(subject, good)],
            vec![
                pair(subject, good),
                pair("cursor", "x"),
                pair("cursor", "y"),
            ],
            vec![pair(subject, good), pair("cursor", "x")],
            vec![pair(subject, good), pair("count", "5"), pair("count", "5")],
            vec![pair(subject, good), pair("count", "99"), pair("count", "5")],
            vec![pair("count", "5"), pair("count", "6"), pair(subject, "")],
            vec![pair("cursor", ""), pair("cursor", ""), pair(subject, "..")],
            vec![pair(subject, good), pair("utm", "1"), pair("utm", "2")],
            vec![pair(subject, good), pair("Count", "999")],
            vec![pair(subject, good), pair("id", "x"), pair("username", "")],
            vec![
                pair(subject, good),
                pair("query", "\u{0}"),
                pair("query", ""),
            ],
            vec![pair(subject, "bad value!"), pair(subject, "x")],
        ] {
            out.push((endpoint, query));
        }
    }
    out
}

#[test]
fn shortvideo_parameters_are_checked_as_today() {
    let d = shortvideo();
    let all = queries();
    let mut differ = Vec::new();
    for (endpoint, query) in &all {
        let query: Vec<(&str, &str)> = query
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (old, new) = (today(endpoint, &query), described(&d, endpoint, &query));
        if old != new {
            differ.push(format!(
                "{endpoint} {query:?}:\n  today {old:?}\n  now   {new:?}"
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert!(all.len() > 1000, "{} queries", all.len());
}

#[test]
fn messages_are_word_for_word() {
    let d = shortvideo();
    let refuse = |endpoint: &str, query: &[(&str, &str)]| {
        d.endpoint(endpoint)
            .unwrap()
            .validate(query.iter().copied())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        refuse("posts", &[("username", "a"), ("count", "31")]),
        "parameter `count` must be an integer from 1 to 30"
    );
    assert_eq!(
        refuse("profile", &[("username", "..")]),
        "parameter `username` must not be made of dots only"
    );
    assert_eq!(
        refuse("profile", &[("username", "lu na")]),
        "parameter `username` must be 1-64 characters of A-Z, a-z, 0-9, `.` and `_`, \
         optionally after one leading `@`"
    );
    assert_eq!(
        refuse("post", &[("id", "x")]),
        "parameter `id` must be 1-20 digits"
    );
    assert_eq!(
        refuse("search", &[("query", "a\u{1}")]),
        "parameter `query` must be 1-100 characters with no control characters"
    );
    assert_eq!(
        refuse("search", &[("query", "")]),
        "parameter `query` is required"
    );
    assert_eq!(
        refuse("profile", &[("username", "a"), ("username", "b")]),
        "parameter `username` is given more than once"
    );
    assert_eq!(
        refuse("comments", &[("id", "1"), ("cursor", "a"), ("cursor", "b")]),
        "parameter `cursor` is given more than once"
    );
}

#[test]
fn values_come_in_the_endpoints_order_with_defaults() {
    let d = shortvideo();
    let posts = d.endpoint("posts").unwrap();
    let v = posts
        .validate([("cursor", "x"), ("username", "@luna"), ("utm", "1")])
        .unwrap();
    assert_eq!(
        v.values(),
        [
            ("username", Value::String("luna".into())),
            ("count", Value::Integer(10))
        ]
    );
    assert_eq!(v.get("cursor"), None);
    assert_eq!(v.most_items(), Some(14));
    let comments = d.endpoint("comments").unwrap();
    let v = comments.validate([("id", "1"), ("count", "7")]).unwrap();
    assert_eq!(v.most_items(), Some(7));
    let profile = d.endpoint("profile").unwrap();
    let v = profile.validate([("username", "luna")]).unwrap();
    assert_eq!((v.page_size(), v.most_items()), (None, None));
}

#[test]
fn a_folded_subject_is_taken_after_prefix_nfc_and_lowercase() {
    let d = load("tests/fixtures/birdwatch.toml", "birdwatch");
    let sightings = d.endpoint("sightings").unwrap();
    let take = |region: &str| {
        sightings
            .validate([("region", region)])
            .map(|v| v.subject().to_owned())
    };
    assert_eq!(take("#Camargue").unwrap(), "camargue");
    assert_eq!(take("CAMARGUE").unwrap(), "camargue");
    // Decomposed é (e + U+0301) is composed, then lowercased.
    assert_eq!(take("#Ce\u{301}vennes").unwrap(), "c\u{e9}vennes");
    assert_eq!(take("#陶芸").unwrap(), "陶芸");
    assert_eq!(take("हिन्दी").unwrap(), "हिन्दी");
    assert_eq!(take("#ΣΟΦΟΣ").unwrap(), "σοφος");
    // The length counts characters after the steps: 40 composed letters.
    assert!(take(&format!("#{}", "E\u{301}".repeat(40))).is_ok());
    assert!(take(&"é".repeat(41)).is_err());
    for bad in ["##camargue", "#", "camar gue", "🥐", "a-b"] {
        let err = take(bad).unwrap_err();
        assert_eq!(
            err,
            ParamError::Invalid {
                name: "region".into(),
                reason:
                    "must be 1-40 letters, marks, digits and `_`, optionally after one leading `#`"
                        .into()
            },
            "{bad}"
        );
    }
}

#[test]
fn a_pattern_of_its_own_and_a_refusal_in_its_own_words() {
    let d = load("tests/fixtures/birdwatch.toml", "birdwatch");
    let bird = d.endpoint("bird").unwrap();
    let take = |ring: &str| {
        bird.validate([("ring", ring)])
            .map(|v| v.subject().to_owned())
    };
    assert_eq!(take("EU-1234").unwrap(), "EU-1234");
    assert_eq!(
        take("EU-0000").unwrap_err().to_string(),
        "parameter `ring` must not be a blank ring"
    );
    for bad in ["eu-1234", "EU1234", "EU-12345", "EU-123", "ЕU-1234"] {
        assert_eq!(
            take(bad).unwrap_err().to_string(),
            "parameter `ring` must be a ring code: two capitals, `-` and four digits",
            "{bad}"
        );
    }
    // An integer parameter beside the page size, whose range starts at 0.
    let sightings = d.endpoint("sightings").unwrap();
    let v = sightings
        .validate([("region", "x"), ("min_birds", "0")])
        .unwrap();
    assert_eq!(v.get("min_birds"), Some(&Value::Integer(0)));
    assert_eq!(v.page_size(), Some(12));
    let err = sightings
        .validate([("region", "x"), ("min_birds", "1001")])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter `min_birds` must be an integer from 0 to 1000"
    );
}

#[test]
fn photogrid_parameters_follow_its_spec() {
    let d = load("tests/fixtures/photogrid.toml", "photogrid");
    let profile = d.endpoint("profile").unwrap();
    let user = |name: &str| {
        profile
            .validate([("username", name)])
            .map(|v| v.subject().to_owned())
    };
    assert_eq!(user("@Luna.Bakes_1").unwrap(), "luna.bakes_1");
    assert!(user(&"a".repeat(30)).is_ok());
    for bad in [
        ".luna",
        "luna.",
        "lu..na",
        "lu-na",
        "@@luna",
        &"a".repeat(31),
    ] {
        assert_eq!(user(bad).unwrap_err().name(), "username", "{bad}");
    }
    let media = d.endpoint("media").unwrap();
    let code = |c: &str| {
        media
            .validate([("shortcode", c)])
            .map(|v| v.subject().to_owned())
    };
    assert_eq!(code("CxYz123_-Ab").unwrap(), "CxYz123_-Ab");
    for bad in ["CxYz123_-A", "CxYz123_-Abc", "CxYz123_.Ab"] {
        assert!(code(bad).is_err(), "{bad}");
    }
    let hashtag = d.endpoint("hashtag").unwrap();
    let tag = |t: &str| {
        hashtag
            .validate([("tag", t)])
            .map(|v| v.subject().to_owned())
    };
    assert_eq!(tag("#陶芸").unwrap(), "陶芸");
    assert_eq!(tag("#हिन्दी").unwrap(), "हिन्दी");
    assert_eq!(tag("#Baking").unwrap(), "baking");
    assert!(tag("#two words").is_err());
    let posts = d.endpoint("posts").unwrap();
    let v = posts.validate([("username", "luna")]).unwrap();
    assert_eq!((v.page_size(), v.most_items()), (Some(12), Some(12)));
    let v = hashtag.validate([("tag", "x"), ("count", "50")]).unwrap();
    assert_eq!(v.most_items(), Some(52));
}
