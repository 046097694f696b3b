//! Drives each endpoint's attempt over the contract's sample payloads.

use super::*;
use plugin_api::testing::conformance::Case;
use plugin_api::testing::{Kit, Reply, Upstream};
use plugin_api::ErrorKind;
use serde_json::{json, Value};

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            "../../../fixtures/upstreams/fallback/",
            $name,
            ".json"
        ))
    };
}

const KEY: &str = "sekret-key-123";
const LUNA: &str = "lunabakes";
const VIDEO: &str = "7312345678901234567";

fn provider(base_url: &str, settings: Value) -> Result<Fallback, String> {
    let api_key = KEY.into();
    let base_url = base_url.into();
    Fallback::new(ProviderConfig {
        base_url,
        api_key,
        settings,
    })
}

/// A call as the host validates it; `count` "" takes the default.
fn call(endpoint: Endpoint, subject: &str, count: &str) -> Call {
    let name = match endpoint {
        Endpoint::Profile | Endpoint::Posts => "username",
        Endpoint::Post | Endpoint::Comments => "id",
        Endpoint::Search => "query",
    };
    Call::from_params(endpoint, [(name, subject), ("count", count)]).unwrap()
}

fn kit() -> Kit {
    Kit::with_config::<Fallback>(ProviderConfig {
        base_url: "https://fb.example/api/".into(),
        api_key: KEY.into(),
        settings: json!({}),
    })
    .unwrap()
}

/// Runs `call` through the test kit (the host's boundary, checks and step
/// cap), answering the n-th request with `bodies[n]` (HTTP 200); gives the
/// query strings asked and the answer. Every request must carry the key
/// and the host derived from the base URL.
fn run(call: Call, bodies: &[&str]) -> (Vec<String>, Result<Done, ProviderError>) {
    let replies = bodies.iter().map(|body| Reply::ok(*body));
    let run = kit().run(&call, &Upstream::replies(replies));
    assert!(!run.capped && !run.unscripted, "{:?}", run.requests);
    let mut asked = Vec::new();
    for request in &run.requests {
        let auth = [("X-RapidAPI-Key", KEY), ("X-RapidAPI-Host", "fb.example")];
        let sent = request
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()));
        assert_eq!(sent.collect::<Vec<_>>(), auth);
        let url = request
            .url()
            .strip_prefix("https://fb.example/api/")
            .unwrap();
        asked.push(url.to_owned());
    }
    if let Err(e) = &run.outcome {
        assert!(!e.to_string().contains(KEY));
    }
    (asked, run.outcome)
}

/// The one request asked, the answer's output as JSON, and its next cursor.
fn ok(call: Call, body: &str) -> (String, Value, Option<String>) {
    let (mut asked, done) = run(call, &[body]);
    let done = done.unwrap();
    (
        asked.remove(0),
        serde_json::to_value(done.output).unwrap(),
        done.next_cursor,
    )
}

fn err(call: Call, body: &str) -> ProviderError {
    run(call, &[body]).1.unwrap_err()
}

fn wrap(data: Value) -> String {
    json!({"code": 0, "msg": "success", "data": data}).to_string()
}

#[test]
fn profile_and_search_share_one_mapping() {
    let (asked, out, _) = ok(call(Endpoint::Profile, LUNA, ""), fixture!("user_info"));
    assert_eq!(asked, "user/info?unique_id=lunabakes");
    let luna = json!({"username": "lunabakes", "display_name": "Luna Bakes 🍰",
        "followers": 5_500_000, "verified": true, "id": "6613926240453148678",
        "bio": "Pastry chef • new recipe every Tuesday\n#baking #dessert",
        "following": 154, "likes": 99_000_000, "videos": 324,
        "avatar_url": "https://p16-sign-sg.cdn.example/aweme/1080x1080/a9e9.jpeg?x-expires=1763876400"});
    assert_eq!(out, json!({ "profile": luna }));

    let search = call(Endpoint::Search, "luna bakes", "2");
    let (asked, out, next) = ok(search, fixture!("user_search"));
    assert_eq!(asked, "user/search?keywords=luna+bakes&count=2&cursor=0");
    assert_eq!(out["search"][0], luna);
    assert_eq!(out["search"][1]["verified"], false);
    assert_eq!(out["search"][1]["bio"], Value::Null);
    assert_eq!(next, None);
}

#[test]
fn posts_and_post_share_one_mapping_without_the_media_key() {
    let (asked, out, next) = ok(call(Endpoint::Post, VIDEO, ""), fixture!("video_detail"));
    assert_eq!(asked, "?url=7312345678901234567&hd=1");
    let croissants = json!({"id": VIDEO,
        "text": "#baking croissants at 3am 🥐 \"lamination\" is a lifestyle",
        "likes": 45312, "comments": 811, "views": 1203344, "shares": 530,
        "created_at": "2025-11-21T04:40:00Z", "duration_ms": 15000, "author": "lunabakes"});
    assert_eq!((out, next), (json!({ "post": croissants }), None));

    let (asked, out, next) = ok(call(Endpoint::Posts, LUNA, ""), fixture!("user_posts"));
    assert_eq!(asked, "user/posts?unique_id=lunabakes&count=10&cursor=0");
    assert_eq!(out["posts"][0], croissants);
    let ids: Vec<_> = (0..3)
        .map(|i| out["posts"][i]["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.join(" "),
        "7312345678901234567 7312345678901234001 7312345678901230002"
    );
    assert_eq!(
        out["posts"][2]["text"],
        "reply to @sam: yes you can freeze the dough\nlink in bio"
    );
    assert_eq!(out["posts"][1]["duration_ms"], 31_000);
    assert_eq!(next.as_deref(), Some("1762500000000"));

    let again = call(Endpoint::Posts, LUNA, "").with_cursor(next);
    let (asked, _, _) = ok(again, fixture!("user_posts"));
    assert!(asked.ends_with("&cursor=1762500000000"), "{asked}");
}

#[test]
fn lenient_shapes_keep_every_digit_and_character() {
    let user = json!({"user": {"id": 0, "uniqueId": "a", "nickname": "A", "verified": 1},
                      "stats": {"followerCount": "1400000", "videoCount": null}});
    // A bare 20-digit integer cannot go through `json!`: splice it in as text.
    let body = wrap(json!({"user_list": [user], "cursor": 4, "hasMore": 1}))
        .replace(r#""id":0"#, r#""id":99999999999999999999"#);
    let (_, out, next) = ok(call(Endpoint::Search, "a", ""), &body);
    let a = json!({"username": "a", "display_name": "A", "followers": 1_400_000, "verified": true,
        "id": "99999999999999999999", "bio": null, "following": null, "likes": null,
        "videos": null, "avatar_url": null});
    assert_eq!(out, json!({ "search": [a] }));
    assert_eq!(next.as_deref(), Some("4"));

    let body = r#"{"code":0,"data":{"videos":[{"aweme_id":"v15044gf0000d724vbfog65ugaj79100",
        "video_id":18446744073709551616,"title":"a\\b \"q\"\n🥐","digg_count":"7",
        "comment_count":"0","duration":null}],"cursor":"9","hasMore":0}}"#;
    let (_, out, next) = ok(call(Endpoint::Posts, LUNA, ""), body);
    let post = json!({"id": "18446744073709551616", "text": "a\\b \"q\"\n🥐", "likes": 7,
        "comments": 0, "views": null, "shares": null, "created_at": null, "duration_ms": null,
        "author": null});
    assert_eq!(out, json!({ "posts": [post] }));
    assert_eq!(next, None);
}

#[test]
fn comments_map_and_page_by_offset() {
    let first_page = call(Endpoint::Comments, VIDEO, "3");
    let (asked, out, next) = ok(first_page, fixture!("comment_list"));
    assert_eq!(asked, format!("comment/list?url={VIDEO}&count=3&cursor=0"));
    let first = json!({"id": "7313000000000000001", "text": "this is art 😭🥐", "likes": 1022,
        "replies": 12, "created_at": "2025-11-21T04:48:20Z", "author": "crumbqueen"});
    assert_eq!(out["comments"][0], first);
    assert_eq!(out["comments"][2]["text"], r#"the \"sound\" of that crust"#);
    assert_eq!(next.as_deref(), Some("3"));

    // A page of `size` comments from `offset`; here the cursor is a string.
    let page = |offset: usize, size: usize| {
        let items: Vec<_> = (offset..offset + size)
            .map(|n| json!({"id": n.to_string(), "text": "", "digg_count": 0}))
            .collect();
        let cursor = (offset + size).to_string();
        wrap(json!({"comments": items, "cursor": cursor, "hasMore": true}))
    };
    let bodies = [page(0, 50), page(50, 50), page(100, 20)];
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    let (asked, done) = run(call(Endpoint::Comments, VIDEO, "120"), &bodies);
    let query = |o, s| format!("comment/list?url={VIDEO}&count={s}&cursor={o}");
    assert_eq!(asked, [query(0, 50), query(50, 50), query(100, 20)]);
    let done = done.unwrap();
    assert_eq!(done.next_cursor.as_deref(), Some("120"));
    let Output::Comments(comments) = done.output else {
        panic!()
    };
    assert_eq!((comments.len(), comments[119].id.as_str()), (120, "119"));
}

#[test]
fn upstream_refusals_classify() {
    use ErrorKind::{BadResponse, NotFound, RateLimited};
    let [profile, posts] = [Endpoint::Profile, Endpoint::Posts].map(|e| call(e, LUNA, ""));
    let [post, comments] = [Endpoint::Post, Endpoint::Comments].map(|e| call(e, VIDEO, ""));
    let search = call(Endpoint::Search, "luna", "");
    let no_user = fixture!("error_user_not_found");
    let no_video = fixture!("error_video_not_found");
    let soft_block = r#"{"code":0,"data":{"hasMore":false}}"#;
    for (c, body, kind) in [
        (&profile, no_user, NotFound),
        (&posts, no_user, NotFound),
        (&post, no_video, NotFound),
        (&comments, no_video, NotFound),
        (&search, fixture!("error_rate_limit"), RateLimited),
        (&comments, soft_block, BadResponse),
        (&search, soft_block, BadResponse),
    ] {
        assert_eq!(err(c.clone(), body).kind(), kind, "{c:?} {body}");
    }
    for body in [
        r#"{"code":-1,"msg":"Something else"}"#,
        r#"{"code":5,"msg":"User doesn't exist"}"#,
        r#"{"msg":"success","data":{}}"#,
        r#"{"code":0,"msg":"success"}"#,
        r#"{"code":0,"data":null}"#,
        r#"{"code":0,"data":[]}"#,
        r#"{"code":0,"data":{"user":{"uniqueId":"a"}}}"#,
        r#"{"code":0,"data":{"videos":"none"}}"#,
        "<html>blocked</html>",
        "",
    ] {
        for c in [&profile, &posts] {
            assert_eq!(err(c.clone(), body).kind(), BadResponse, "{body}");
        }
    }
}

#[test]
fn a_null_list_is_an_empty_page_and_a_missing_one_a_bad_response() {
    let no_more = r#""cursor":"0","hasMore":false"#;
    for (c, list) in [
        (call(Endpoint::Posts, LUNA, ""), "videos"),
        (call(Endpoint::Comments, VIDEO, ""), "comments"),
        (call(Endpoint::Search, "luna", ""), "user_list"),
    ] {
        let body = format!(r#"{{"code":0,"data":{{"{list}":null,{no_more}}}}}"#);
        let (_, out, next) = ok(c.clone(), &body);
        assert_eq!(out.as_object().unwrap().values().next(), Some(&json!([])));
        assert_eq!(next, None, "{body}");
        let body = format!(r#"{{"code":0,"data":{{{no_more}}}}}"#);
        let missing = err(c, &body);
        assert_eq!(missing.kind(), ErrorKind::BadResponse, "{body}");
        assert!(missing.to_string().contains(list), "{missing}");
    }
}

#[test]
fn a_search_result_whose_handle_is_no_handle_is_left_out() {
    let account = |handle: &str| {
        json!({"user": {"uniqueId": handle, "nickname": "A", "verified": 0},
               "stats": {"followerCount": 1}})
    };
    let body = wrap(json!({
        "user_list": [account("luna"), account("luna bakes"), account("@crumb.queen")],
        "cursor": 3, "hasMore": 1
    }));
    let (_, out, next) = ok(call(Endpoint::Search, "luna", ""), &body);
    let handles: Vec<_> = out["search"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["username"].clone())
        .collect();
    assert_eq!(handles, [json!("luna"), json!("crumb.queen")]);
    assert_eq!(next.as_deref(), Some("3"), "the listing goes on");
    // A profile's own odd handle is a bad response: the next provider is asked.
    let body = r#"{"code":0,"data":{"user":{"uniqueId":"luna bakes","nickname":"A","verified":0},
        "stats":{"followerCount":1}}}"#;
    let error = err(call(Endpoint::Profile, "luna", ""), body);
    assert_eq!(error.kind(), ErrorKind::BadResponse, "{error}");
}

#[test]
fn a_next_cursor_that_goes_back_ends_the_listing() {
    // One item a page: an empty page ends the listing whatever its cursor.
    let page = |name: &str, list: &str| {
        let body: Value = serde_json::from_str(name).unwrap();
        json!([body["data"][list][0].clone()])
    };
    let videos = page(fixture!("user_posts"), "videos");
    let accounts = page(fixture!("user_search"), "user_list");
    let posts = |sent: &str, cursor: &str| {
        let body = wrap(json!({"videos": videos, "cursor": cursor, "hasMore": true}));
        let at = call(Endpoint::Posts, LUNA, "").with_cursor(Some(sent.to_owned()));
        ok(at, &body).2
    };
    // Posts' cursors are the upstream's own (times, here): any new one
    // but the first page's goes on.
    assert_eq!(
        posts("1762500000000", "1762400000000").as_deref(),
        Some("1762400000000")
    );
    assert_eq!(posts("1762500000000", "1762500000000"), None);
    assert_eq!(posts("1762500000000", "0"), None);
    // Search's are offsets: only further on goes on.
    let search = |sent: &str, cursor: u64| {
        let body = wrap(json!({"user_list": accounts, "cursor": cursor, "hasMore": 1}));
        let at = call(Endpoint::Search, "luna", "").with_cursor(Some(sent.to_owned()));
        ok(at, &body).2
    };
    assert_eq!(search("4", 8).as_deref(), Some("8"));
    for back in [0, 2, 4] {
        assert_eq!(search("4", back), None, "{back}");
    }
}

#[test]
fn a_fraction_of_a_second_is_kept_in_milliseconds() {
    let video = json!({"id": VIDEO, "title": "t", "digg_count": 1, "comment_count": 0,
        "duration": 15.4});
    let (_, out, _) = ok(call(Endpoint::Post, VIDEO, ""), &wrap(video));
    assert_eq!(out["post"]["duration_ms"], 15_400);
}

#[test]
fn missing_required_fields_are_named() {
    let user = json!({"uniqueId": "a", "nickname": "A"});
    let account = json!({"user": user, "stats": {"followerCount": 1}});
    let video = json!({"aweme_id": "v1", "id": "1", "title": "t", "digg_count": 1});
    let comment = json!({"id": "1", "digg_count": 1});
    for (c, data, field) in [
        (Endpoint::Profile, account, "user.verified"),
        (Endpoint::Posts, json!({ "videos": [video] }), "video_id"),
        (Endpoint::Post, json!({"video_id": "1", "title": "t"}), "id"),
        (Endpoint::Comments, json!({ "comments": [comment] }), "text"),
    ] {
        let got = err(call(c, "1", ""), &wrap(data)).to_string();
        assert!(got.contains(&format!("required field `{field}`")), "{got}");
    }
}

#[test]
fn config_derives_the_rapidapi_host() {
    let host = |base: &str, settings| provider(base, settings).map(|p| p.upstream.host.clone());
    for (base, want) in [
        ("http://127.0.0.1:8080/x", "127.0.0.1"),
        ("https://api.example.com", "api.example.com"),
        ("http://[::1]:9/", "[::1]"),
        ("https://user:pw@h.example:443/p?q", "h.example"),
    ] {
        assert_eq!(host(base, json!({})).as_deref(), Ok(want), "{base}");
        assert_eq!(host(base, Value::Null).as_deref(), Ok(want), "{base}");
    }
    let given = json!({"rapidapi_host": "x.p.rapidapi.com"});
    assert_eq!(
        host("http://127.0.0.1:1", given).as_deref(),
        Ok("x.p.rapidapi.com")
    );
    for bad in ["http://", "http:///x", "http://u@:80/", "no-scheme.example"] {
        assert_eq!(
            host(bad, json!({})),
            Err("base_url has no host".into()),
            "{bad}"
        );
    }
    // Abuse sweep: a header value every request would be refused for.
    for bad in ["evil\r\nX-Injected: yes", "x.example com", "x.example\t"] {
        let refused = host("http://h", json!({ "rapidapi_host": bad })).unwrap_err();
        assert!(
            refused.contains("rapidapi_host must be a host name"),
            "{refused}"
        );
    }
    let typo = host("http://h", json!({"rapidapi_hots": "x"})).unwrap_err();
    assert!(typo.contains("rapidapi_hots"), "{typo}");
    assert_eq!(Fallback::manifest().endpoints, Endpoint::ALL);
}

#[test]
fn keeps_the_hosts_rules() {
    let upstream = Upstream::by_path([
        ("/user/info", Reply::ok(fixture!("user_info"))),
        ("/user/posts", Reply::ok(fixture!("user_posts"))),
        ("/comment/list", Reply::ok(fixture!("comment_list"))),
        ("/user/search", Reply::ok(fixture!("user_search"))),
        // F3 is the base URL itself.
        ("/api/", Reply::ok(fixture!("video_detail"))),
    ]);
    let no_user = Upstream::always(Reply::ok(fixture!("error_user_not_found")));
    let no_video = Upstream::always(Reply::ok(fixture!("error_video_not_found")));
    let [profile, posts] = [Endpoint::Profile, Endpoint::Posts].map(|e| call(e, LUNA, ""));
    let [post, comments] = [Endpoint::Post, Endpoint::Comments].map(|e| call(e, VIDEO, "3"));
    kit()
        .conformance()
        .case(Case::new(profile, upstream.clone()).not_found(no_user.clone()))
        .case(Case::new(posts, upstream.clone()).not_found(no_user.clone()))
        .case(Case::new(post, upstream.clone()).not_found(no_video.clone()))
        .case(Case::new(comments, upstream.clone()).not_found(no_video))
        // A search has nothing to be missing: the upstream's "no such
        // user" must not end the chain there.
        .case(Case::new(call(Endpoint::Search, "luna", ""), upstream).not_found(no_user))
        .run()
        .assert_passes();
}
