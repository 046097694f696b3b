//! Answer checks: the answers the service gives today pass; for shortvideo
//! every defect is refused exactly where plugin-api's schema and
//! `Output::check` refuse it today; for the test platform, each rule of the
//! format refuses its defect with the path and the reason.

use platform_description::{AnswerError, Description};
use plugin_api::{Call, Comment, Endpoint, Output, Post, Profile};
use serde_json::{json, Value};
use std::path::Path;

fn load(path: &str, name: &str) -> Description {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    Description::load(&path, name).unwrap()
}

fn shortvideo() -> Description {
    load("../platforms/shortvideo.toml", "shortvideo")
}

#[test]
fn todays_answers_pass() {
    let d = shortvideo();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/answers/shortvideo.json");
    let fixtures: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let answers = fixtures["answers"].as_array().unwrap();
    for answer in answers {
        let endpoint = d.endpoint(answer["endpoint"].as_str().unwrap()).unwrap();
        let count = answer["count"].as_u64();
        let checked = endpoint.check_answer(&answer["data"], count);
        assert_eq!(checked, Ok(()), "{}", answer["from"]);
        // And today's rules take them too.
        assert!(
            today(endpoint.name(), &answer["data"], count),
            "{}",
            answer["from"]
        );
    }
    assert!(answers.len() >= 10);
}

/// Whether today's rules take `data` as an answer of `endpoint`: it reads
/// as the schema's types and passes `Output::check`.
fn today(endpoint: &str, data: &Value, count: Option<u64>) -> bool {
    let data = data.clone();
    let output = match endpoint {
        "profile" => serde_json::from_value::<Profile>(data).map(Output::Profile),
        "posts" => serde_json::from_value::<Vec<Post>>(data).map(Output::Posts),
        "post" => serde_json::from_value::<Post>(data).map(Output::Post),
        "comments" => serde_json::from_value::<Vec<Comment>>(data).map(Output::Comments),
        "search" => serde_json::from_value::<Vec<Profile>>(data).map(Output::Search),
        other => panic!("{other}"),
    };
    let subject = match endpoint {
        "profile" | "posts" => ("username", "a"),
        "post" | "comments" => ("id", "1"),
        _ => ("query", "a"),
    };
    let count = count.map(|c| c.to_string());
    let mut params = vec![subject];
    params.extend(count.as_deref().map(|c| ("count", c)));
    let call = Call::from_params(Endpoint::from_segment(endpoint).unwrap(), params).unwrap();
    output.is_ok_and(|output| output.check(call.most_items()).is_ok())
}

/// A valid item of each object type, every field set.
fn item(object: &str) -> Value {
    match object {
        "profile" => json!({"username": "luna.bakes_1", "display_name": "Luna", "followers": 5,
            "verified": true, "id": "66", "bio": "hi", "following": 1, "likes": 2, "videos": 3,
            "avatar_url": "https://example.com/a.jpg"}),
        "post" => json!({"id": "7312345678901234567", "text": "t", "likes": 1, "comments": 2,
            "views": 3, "shares": 4, "created_at": "2025-11-21T04:40:00Z", "duration_ms": 5,
            "author": "luna"}),
        _ => json!({"id": "7313000000000000001", "text": "c", "likes": 1, "replies": 0,
            "created_at": "2025-11-21T04:48:20Z", "author": "crumb"}),
    }
}

/// Values a field may be set to: every kind of JSON value, and the edges
/// of each rule today's types and checks have.
fn values() -> Vec<Value> {
    let mut values = vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(1.0),
        json!(u64::MAX),
        // Above u64: serde_json reads it as a float.
        serde_json::from_str("18446744073709551616").unwrap(),
        json!([]),
        json!({}),
        json!(""),
        json!("0"),
        json!("12a"),
        json!("99999999999999999999"),
        json!("123456789012345678901"),
        json!("luna"),
        json!("@luna"),
        json!(".."),
        json!("_."),
        json!("lüna"),
        json!("luna bakes"),
        json!("a".repeat(64)),
        json!("a".repeat(65)),
        json!("2025-11-21T04:40:00Z"),
        json!("2025-02-29T00:00:00Z"),
        json!("2025-11-21T04:40:00"),
        json!("https://example.com/a.jpg"),
        json!("javascript:alert(1)"),
        json!("https://example.com/a b"),
        json!("https:///a.jpg"),
    ];
    values.push(json!("9".repeat(20)));
    values
}

#[test]
fn shortvideo_defects_are_refused_where_they_are_today() {
    let d = shortvideo();
    let mut differ = Vec::new();
    let mut cases = 0;
    let mut compare = |endpoint: &str, data: &Value, count: Option<u64>| {
        let old = today(endpoint, data, count);
        let new = d.endpoint(endpoint).unwrap().check_answer(data, count);
        if old != new.is_ok() {
            differ.push(format!("{endpoint} {data}: today {old}, now {new:?}"));
        }
        cases += 1;
    };
    for (endpoint, object, count) in [
        ("profile", "profile", None),
        ("post", "post", None),
        ("posts", "post", Some(10)),
        ("comments", "comment", Some(20)),
        ("search", "profile", Some(10)),
    ] {
        let wrap = |value: Value| match count {
            Some(_) => json!([item(object), value]),
            None => value,
        };
        let fields: Vec<String> = item(object).as_object().unwrap().keys().cloned().collect();
        for field in &fields {
            for value in values() {
                let mut changed = item(object);
                changed[field] = value;
                compare(endpoint, &wrap(changed), count);
            }
        }
        // A missing field: today's types fill a nullable one in as null,
        // and the description wants every field present: only the
        // non-nullable ones are compared here (see below).
        for field in &fields {
            let nullable = d.object(object).unwrap().field(field).unwrap().nullable();
            let mut changed = item(object);
            changed.as_object_mut().unwrap().remove(field);
            if !nullable {
                compare(endpoint, &wrap(changed), count);
            }
        }
        let mut extra = item(object);
        extra["sec_uid"] = json!("MS4wLjABAAAA");
        compare(endpoint, &wrap(extra), count);
        for data in [json!(null), json!("x"), json!(1), json!([]), json!({})] {
            compare(endpoint, &data, count);
        }
        if let Some(count) = count {
            let most = match endpoint {
                "posts" => count + 4,
                _ => count,
            } as usize;
            for len in [0, 1, most, most + 1] {
                compare(endpoint, &json!(vec![item(object); len]), Some(count));
            }
            compare(endpoint, &json!([item(object), null]), Some(count));
            compare(endpoint, &json!([item(object), []]), Some(count));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert!(cases > 1000, "{cases} cases");
}

#[test]
fn every_field_is_present_even_a_nullable_one() {
    let d = shortvideo();
    let mut profile = item("profile");
    profile.as_object_mut().unwrap().remove("bio");
    assert_eq!(
        d.endpoint("profile")
            .unwrap()
            .check_answer(&profile, None)
            .unwrap_err()
            .to_string(),
        "data.bio: missing"
    );
}

fn birdwatch() -> Description {
    load("tests/fixtures/birdwatch.toml", "birdwatch")
}

fn bird() -> Value {
    json!({"ring": "EU-1234", "name": "Greater flamingo", "wingspan_mm": 1550, "rare": false,
           "last_seen": null, "status": "migrant", "id": "18446744073709551616",
           "note": "limping", "photo_url": "http://birds.example/eu-1234.jpg"})
}

#[test]
fn the_test_platforms_answers_pass() {
    let d = birdwatch();
    let bird_endpoint = d.endpoint("bird").unwrap();
    assert_eq!(bird_endpoint.check_answer(&bird(), None), Ok(()));
    let sightings = json!([
        {"id": "1", "ring": "EU-1234", "region": "camargue", "seen_at": "2025-11-21T04:40:00Z",
         "birds": 3, "observer": null},
        {"id": "2", "ring": "", "region": "陶芸", "seen_at": "2000-02-29T23:59:59Z",
         "birds": 0, "observer": "ann"},
    ]);
    let endpoint = d.endpoint("sightings").unwrap();
    assert_eq!(endpoint.check_answer(&sightings, Some(2)), Ok(()));
    // Exact: at most the page size.
    assert_eq!(
        endpoint
            .check_answer(&sightings, Some(1))
            .unwrap_err()
            .to_string(),
        "data: 2 items where at most 1 were asked"
    );
    // At most the page size and two: `size` 1 takes 3 birds, not 4.
    let flock = d.endpoint("flock").unwrap();
    assert_eq!(
        flock.check_answer(&json!([bird(), bird(), bird()]), Some(1)),
        Ok(())
    );
    assert_eq!(
        flock
            .check_answer(&json!([bird(), bird(), bird(), bird()]), Some(1))
            .unwrap_err()
            .to_string(),
        "data: 4 items where at most 3 were asked"
    );
}

#[test]
fn each_rule_refuses_its_defect_with_the_path() {
    let d = birdwatch();
    let flock = d.endpoint("flock").unwrap();
    let refusal = |field: &str, value: Value| -> String {
        let mut changed = bird();
        changed[field] = value;
        flock
            .check_answer(&json!([bird(), changed]), Some(10))
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (
            "ring",
            json!("eu-1234"),
            "data[1].ring: does not match the description's pattern",
        ),
        (
            "ring",
            json!("EU-0000"),
            "data[1].ring: must not be a blank ring",
        ),
        (
            "ring",
            json!(null),
            "data[1].ring: null, and the field is not nullable",
        ),
        (
            "name",
            json!(""),
            "data[1].name: a length outside the description's",
        ),
        (
            "name",
            json!("x".repeat(81)),
            "data[1].name: a length outside the description's",
        ),
        ("name", json!(7), "data[1].name: not a string"),
        (
            "wingspan_mm",
            json!(-3),
            "data[1].wingspan_mm: not a whole number from 0 to 2^64 - 1",
        ),
        (
            "wingspan_mm",
            json!("1550"),
            "data[1].wingspan_mm: not a whole number from 0 to 2^64 - 1",
        ),
        ("rare", json!(0), "data[1].rare: not a boolean"),
        (
            "last_seen",
            json!("2025-11-21"),
            "data[1].last_seen: not a time written YYYY-MM-DDTHH:MM:SSZ",
        ),
        (
            "last_seen",
            json!(1763700000),
            "data[1].last_seen: not a string",
        ),
        (
            "status",
            json!("extinct"),
            "data[1].status: not one of the values the description lists",
        ),
        (
            "status",
            json!("Migrant"),
            "data[1].status: not one of the values the description lists",
        ),
        ("id", json!(7), "data[1].id: not a string"),
        (
            "id",
            json!("v15044gf0000d724"),
            "data[1].id: not an ID of 1-20 digits",
        ),
        (
            "note",
            json!(""),
            "data[1].note: an empty string, where the description says null",
        ),
        (
            "photo_url",
            json!("javascript:alert(1)"),
            "data[1].photo_url: not an http(s) URL",
        ),
        (
            "photo_url",
            json!(""),
            "data[1].photo_url: not an http(s) URL",
        ),
    ];
    for (field, value, expected) in cases {
        assert_eq!(refusal(field, value.clone()), expected, "{field} = {value}");
    }
    let mut missing = bird();
    missing.as_object_mut().unwrap().remove("rare");
    assert_eq!(
        flock
            .check_answer(&json!([missing]), Some(10))
            .unwrap_err()
            .to_string(),
        "data[0].rare: missing"
    );
    // An extra key is not named: it is upstream text, and may be a secret.
    let mut extra = bird();
    extra["sk_live_0123456789"] = json!(1);
    let err = flock.check_answer(&json!([extra]), Some(10)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "data[0]: a field the description does not have"
    );
    assert!(matches!(err, AnswerError::Extra { .. }));
    assert_eq!(
        flock
            .check_answer(&json!([bird(), "bird"]), Some(10))
            .unwrap_err()
            .to_string(),
        "data[1]: not an object"
    );
    assert_eq!(
        flock
            .check_answer(&bird(), Some(10))
            .unwrap_err()
            .to_string(),
        "data: not a list"
    );
    let one = d.endpoint("bird").unwrap();
    assert_eq!(
        one.check_answer(&json!([bird()]), None)
            .unwrap_err()
            .to_string(),
        "data: not an object"
    );
    let mut wrong = bird();
    wrong["status"] = json!(null);
    assert_eq!(
        one.check_answer(&wrong, None).unwrap_err().to_string(),
        "data.status: null, and the field is not nullable"
    );
}

#[test]
fn refusals_never_quote_the_value() {
    let d = birdwatch();
    let secret = "sk_live_0123456789abcdef";
    let one = d.endpoint("bird").unwrap();
    for field in [
        "ring",
        "last_seen",
        "status",
        "id",
        "photo_url",
        "wingspan_mm",
    ] {
        let mut changed = bird();
        changed[field] = json!(format!("{secret} {secret}"));
        let err = one.check_answer(&changed, None).unwrap_err();
        assert!(!err.to_string().contains("sk_live"), "{err}");
    }
}
