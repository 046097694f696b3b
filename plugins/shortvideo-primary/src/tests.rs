//! The provider driven through its public API with the contract's sample
//! payloads (fixtures/upstreams/primary) and variations of them.

use plugin_api::testing::conformance::Case;
use plugin_api::testing::{Kit, Reply, Run, Upstream, MAX_STEPS};
use plugin_api::{
    Call, Comment, Done, Endpoint, ErrorKind, Next, Output, Post, Profile, Provider,
    ProviderConfig, ProviderError, UpstreamRequest, UpstreamResponse,
};
use serde_json::json;

use crate::Primary;

const PROFILE: &str = include_str!("../../../fixtures/upstreams/primary/user_profile.json");
const POSTS: &str = include_str!("../../../fixtures/upstreams/primary/user_posts.json");
const DETAIL: &str = include_str!("../../../fixtures/upstreams/primary/aweme_detail.json");
const COMMENTS: &str = include_str!("../../../fixtures/upstreams/primary/comment_list.json");
const DETAIL_NULL: &str =
    include_str!("../../../fixtures/upstreams/primary/error_detail_null.json");
const SOFT_BLOCK: &str = include_str!("../../../fixtures/upstreams/primary/error_soft_block.json");
const TRY_AGAIN: &str = include_str!("../../../fixtures/upstreams/primary/error_try_again.json");
const NO_USER: &str = include_str!("../../../fixtures/upstreams/primary/error_user_not_found.json");
const NO_VIDEO: &str =
    include_str!("../../../fixtures/upstreams/primary/error_video_unavailable.json");

const KEY: &str = "sk-test-4f1c9e";
const SEC_UID: &str =
    "MS4wLjABAAAAUpRG8iW2MhXVncQ_Q6ZPp95JEbGbb3Ud7t6xeNXYqFXc9VkGLe00zpLrZm4Gt2Kl";

fn kit() -> Kit {
    Kit::with_config::<Primary>(ProviderConfig {
        base_url: "http://up.test/api/".into(),
        api_key: KEY.into(),
        settings: json!({}),
    })
    .unwrap()
}

/// Drives one call to its end through the test kit (the host's boundary,
/// checks and step cap), answering each request (HTTP 200) with what
/// `upstream` returns for it. Gives the requests made and the outcome.
fn drive(
    call: Call,
    upstream: impl Fn(&UpstreamRequest) -> String + Send + Sync + 'static,
) -> (Vec<UpstreamRequest>, Result<Done, ProviderError>) {
    let run = kit().run(&call, &Upstream::with(move |r| Reply::ok(upstream(r))));
    finish(run)
}

/// Every request carries the key; no error shows it; no attempt runs out
/// of steps.
fn finish(run: Run) -> (Vec<UpstreamRequest>, Result<Done, ProviderError>) {
    assert!(!run.capped, "attempt did not finish in {MAX_STEPS} steps");
    for request in &run.requests {
        let key = request.headers().iter().find(|(n, _)| n == "X-Api-Key");
        assert_eq!(key.map(|(_, v)| v.as_str()), Some(KEY), "{request:?}");
    }
    if let Err(e) = &run.outcome {
        assert!(!e.message().contains(KEY), "key leaked: {e}");
    }
    (run.requests, run.outcome)
}

/// Answers the requests in turn with `bodies`.
fn replay(call: Call, bodies: &[&str]) -> (Vec<UpstreamRequest>, Result<Done, ProviderError>) {
    let replies = bodies.iter().map(|body| Reply::ok(*body));
    let run = kit().run(&call, &Upstream::replies(replies));
    assert!(!run.unscripted, "unexpected {:?}", run.requests.last());
    finish(run)
}

fn urls(requests: &[UpstreamRequest]) -> Vec<&str> {
    requests.iter().map(UpstreamRequest::url).collect()
}

fn profile_call() -> Call {
    Call::Profile {
        username: "lunabakes".into(),
    }
}

fn posts_call(cursor: Option<&str>) -> Call {
    Call::Posts {
        username: "lunabakes".into(),
        count: 10,
        cursor: cursor.map(Into::into),
    }
}

fn post_call() -> Call {
    Call::Post {
        id: "7312345678901234567".into(),
    }
}

fn comments_call(count: u32) -> Call {
    Call::Comments {
        id: "7312345678901234567".into(),
        count,
        cursor: None,
    }
}

fn profile(body: &str) -> Result<Profile, ProviderError> {
    replay(profile_call(), &[body])
        .1
        .map(|done| match done.output {
            Output::Profile(p) => p,
            other => panic!("{other:?}"),
        })
}

fn post(body: &str) -> Result<Post, ProviderError> {
    replay(post_call(), &[body])
        .1
        .map(|done| match done.output {
            Output::Post(p) => p,
            other => panic!("{other:?}"),
        })
}

fn comments(body: &str) -> Result<(Vec<Comment>, Option<String>), ProviderError> {
    replay(comments_call(3), &[body])
        .1
        .map(|done| match done.output {
            Output::Comments(c) => (c, done.next_cursor),
            other => panic!("{other:?}"),
        })
}

fn kind<T: std::fmt::Debug>(outcome: Result<T, ProviderError>) -> ErrorKind {
    outcome.unwrap_err().kind()
}

#[test]
fn manifest_serves_all_but_search() {
    let m = Primary::manifest();
    assert_eq!(
        (m.name.as_str(), m.platform.as_str()),
        ("shortvideo-primary", "shortvideo")
    );
    assert_eq!(m.version, env!("CARGO_PKG_VERSION"));
    assert!(!m.endpoints.contains(&Endpoint::Search));
    assert_eq!(m.endpoints.len(), 4);
    let search = Call::Search {
        query: "x".into(),
        count: 5,
        cursor: None,
    };
    assert_eq!(kind(replay(search, &[]).1), ErrorKind::Unsupported);
}

#[test]
fn settings_must_be_empty() {
    let with = |settings| {
        Primary::new(ProviderConfig {
            base_url: "http://h".into(),
            api_key: KEY.into(),
            settings,
        })
    };
    assert!(with(json!({})).is_ok());
    assert!(with(serde_json::Value::Null).is_ok());
    let err = with(json!({"rapidapi_host": "x"})).err().unwrap();
    assert!(err.contains("rapidapi_host") && !err.contains(KEY), "{err}");
    assert!(with(json!("x")).is_err());
}

#[test]
fn profile_maps_every_field() {
    let (requests, done) = replay(profile_call(), &[PROFILE]);
    assert_eq!(
        urls(&requests),
        ["http://up.test/api/v1/user/profile?unique_id=lunabakes"]
    );
    let Output::Profile(p) = done.unwrap().output else {
        panic!()
    };
    assert_eq!(
        p,
        Profile {
            username: "lunabakes".into(),
            display_name: "Luna Bakes 🍰".into(),
            followers: 5_479_588,
            verified: true,
            id: Some("6613926240453148678".into()),
            bio: Some("Pastry chef • new recipe every Tuesday\n#baking #dessert".into()),
            following: Some(154),
            likes: Some(98_989_516),
            videos: Some(324),
            avatar_url: Some(
                "https://p16-sign-va.cdn.example/tos-maliva-avt-0068/a9e9abbd~c5_1080x1080.webp\
                 ?x-expires=1763876400&x-signature=abc"
                    .into()
            ),
        }
    );
}

#[test]
fn verified_comes_from_the_two_strings_not_verification_type() {
    let user = |fields: &str| {
        format!(
            r#"{{"status_code":0,"user":{{"unique_id":"a","nickname":"A","follower_count":1{fields}}}}}"#
        )
    };
    let verified = |fields: &str| profile(&user(fields)).unwrap().verified;
    assert!(!verified(
        r#","verification_type":1,"custom_verify":"","enterprise_verify_reason":"""#
    ));
    assert!(!verified(r#","verification_type":1,"custom_verify":null"#));
    assert!(verified(r#","custom_verify":"Popular creator""#));
    assert!(verified(
        r#","custom_verify":"","enterprise_verify_reason":"Verified account""#
    ));
}

#[test]
fn profile_extras_may_be_missing_required_may_not() {
    let p = profile(
        r#"{"status_code":0,"user":{"unique_id":"a","nickname":"","follower_count":0,
        "uid":null,"signature":"","avatar_larger":{"url_list":[]},"following_count":null}}"#,
    )
    .unwrap();
    assert_eq!((p.display_name.as_str(), p.verified), ("", false));
    assert_eq!(
        (p.id, p.bio, p.following, p.likes, p.videos, p.avatar_url),
        (None, None, None, None, None, None)
    );
    for (body, field) in [
        (r#"{"nickname":"A","follower_count":1}"#, "user.unique_id"),
        (r#"{"unique_id":"a","follower_count":1}"#, "user.nickname"),
        (
            r#"{"unique_id":"a","nickname":"A","follower_count":null}"#,
            "user.follower_count",
        ),
    ] {
        let err = profile(&format!(r#"{{"status_code":0,"user":{body}}}"#)).unwrap_err();
        assert_eq!(err, ProviderError::missing(field));
    }
}

#[test]
fn big_ids_keep_every_digit_and_counters_may_be_strings() {
    for id in ["18446744073709551616", "99999999999999999999"] {
        let p = profile(&format!(
            r#"{{"status_code":0,"user":{{"uid":{id},"unique_id":"a","nickname":"A",
                "follower_count":"5479588","following_count":"154","aweme_count":"0"}}}}"#
        ))
        .unwrap();
        assert_eq!(p.id.as_deref(), Some(id));
        assert_eq!(
            (p.followers, p.following, p.videos),
            (5_479_588, Some(154), Some(0))
        );

        let v = post(&format!(
            r#"{{"status_code":0,"aweme_detail":{{"aweme_id":{id},"desc":"",
                "statistics":{{"digg_count":"7","comment_count":"8","play_count":"9"}},
                "video":{{"duration":"1500"}},"create_time":"1763700000"}}}}"#
        ))
        .unwrap();
        assert_eq!(v.id, id);
        assert_eq!(
            (v.likes, v.comments, v.views, v.shares),
            (7, 8, Some(9), None)
        );
        assert_eq!(v.duration_ms, Some(1500));
        assert_eq!(v.created_at.unwrap().to_string(), "2025-11-21T04:40:00Z");

        let (c, _) = comments(&format!(
            r#"{{"status_code":0,"comments":[{{"cid":{id},"text":"hi","digg_count":"3"}}],"cursor":1,"has_more":0}}"#
        ))
        .unwrap();
        assert_eq!((c[0].id.as_str(), c[0].likes), (id, 3));
    }
}

#[test]
fn post_maps_every_field() {
    let (requests, done) = replay(post_call(), &[DETAIL]);
    assert_eq!(
        urls(&requests),
        ["http://up.test/api/v1/aweme/detail?aweme_id=7312345678901234567"]
    );
    let Output::Post(p) = done.unwrap().output else {
        panic!()
    };
    assert_eq!(
        p,
        Post {
            id: "7312345678901234567".into(),
            text: "#baking croissants at 3am 🥐 \"lamination\" is a lifestyle".into(),
            likes: 45_312,
            comments: 811,
            views: Some(1_203_344),
            shares: Some(530),
            created_at: plugin_api::Timestamp::from_unix(1_763_700_000),
            duration_ms: Some(15_379),
            author: Some("lunabakes".into()),
        }
    );
}

#[test]
fn a_fraction_of_a_millisecond_is_rounded() {
    let detail = DETAIL.replace(r#""duration": 15379"#, r#""duration": 15379.6"#);
    assert_ne!(detail, DETAIL);
    assert_eq!(post(&detail).unwrap().duration_ms, Some(15_380));
}

#[test]
fn post_required_fields() {
    for (aweme, field) in [
        (
            r#"{"desc":"x","statistics":{"digg_count":1,"comment_count":1}}"#,
            "aweme_id",
        ),
        (
            r#"{"aweme_id":"1","statistics":{"digg_count":1,"comment_count":1}}"#,
            "desc",
        ),
        (
            r#"{"aweme_id":"1","desc":"x","statistics":{"comment_count":1}}"#,
            "statistics.digg_count",
        ),
        (
            r#"{"aweme_id":"1","desc":"x","statistics":null}"#,
            "statistics.digg_count",
        ),
        (
            r#"{"aweme_id":"1","desc":"x","statistics":{"digg_count":1}}"#,
            "statistics.comment_count",
        ),
    ] {
        let err = post(&format!(r#"{{"status_code":0,"aweme_detail":{aweme}}}"#)).unwrap_err();
        assert_eq!(err, ProviderError::missing(field));
    }
}

#[test]
fn posts_take_two_requests_then_one_per_page_by_cursor() {
    let (requests, done) = replay(posts_call(None), &[PROFILE, POSTS]);
    assert_eq!(
        urls(&requests),
        [
            "http://up.test/api/v1/user/profile?unique_id=lunabakes".to_string(),
            format!("http://up.test/api/v1/user/posts?sec_user_id={SEC_UID}&count=10&max_cursor=0"),
        ]
    );
    let done = done.unwrap();
    let cursor = format!("1762500000000:{SEC_UID}");
    assert_eq!(done.next_cursor.as_deref(), Some(cursor.as_str()));
    let Output::Posts(posts) = done.output else {
        panic!()
    };
    let ids: Vec<&str> = posts.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "7312345678901234567",
            "7312345678901234001",
            "7312345678901230002"
        ]
    );
    assert_eq!(
        posts[2].text,
        "reply to @sam: yes you can freeze the dough\nlink in bio"
    );
    assert_eq!((posts[2].likes, posts[2].duration_ms), (1200, Some(58_123)));

    let last = POSTS.replace(r#""has_more": 1"#, r#""has_more": 0"#);
    let (requests, done) = replay(posts_call(Some(&cursor)), &[&last]);
    assert_eq!(
        urls(&requests),
        [format!(
            "http://up.test/api/v1/user/posts?sec_user_id={SEC_UID}&count=10&max_cursor=1762500000000"
        )]
    );
    assert_eq!(done.unwrap().next_cursor, None);
}

#[test]
fn posts_cursor_must_be_ours() {
    for bad in ["abc", "12", "12:", ":x"] {
        let (requests, done) = replay(posts_call(Some(bad)), &[]);
        assert!(requests.is_empty());
        assert_eq!(kind(done), ErrorKind::BadResponse, "{bad}");
    }
}

#[test]
fn posts_edge_pages() {
    let page = |list: &str, more: &str| {
        let body = format!(r#"{{"status_code":0,{list}"max_cursor":5,"has_more":{more}}}"#);
        replay(posts_call(Some("1:s")), &[&body]).1
    };
    // null is an empty list, which ends the listing whatever has_more says.
    let done = page(r#""aweme_list":null,"#, "1").unwrap();
    assert_eq!(
        (done.output, done.next_cursor),
        (Output::Posts(vec![]), None)
    );
    assert_eq!(kind(page("", "0")), ErrorKind::BadResponse);
    // A `max_cursor` of 0 asks for the first page again: following it
    // would go round for ever, so it ends the listing.
    let back_to_the_start = POSTS.replace("1762500000000", "0");
    let done = replay(posts_call(Some("1762500000000:s")), &[&back_to_the_start]);
    let done = done.1.unwrap();
    assert!(matches!(&done.output, Output::Posts(p) if !p.is_empty()));
    assert_eq!(done.next_cursor, None);
    let no_cursor = r#"{"status_code":0,"aweme_list":[{"aweme_id":"1","desc":"",
        "statistics":{"digg_count":0,"comment_count":0}}],"has_more":true}"#;
    let err = replay(posts_call(Some("1:s")), &[no_cursor]).1.unwrap_err();
    assert_eq!(err, ProviderError::missing("max_cursor"));
    let no_sec_uid = r#"{"status_code":0,"user":{"unique_id":"a","sec_uid":""}}"#;
    let err = replay(posts_call(None), &[no_sec_uid]).1.unwrap_err();
    assert_eq!(err, ProviderError::missing("user.sec_uid"));
}

#[test]
fn comments_map_every_field_and_text_passes_exactly() {
    let (requests, done) = replay(comments_call(3), &[COMMENTS]);
    assert_eq!(
        urls(&requests),
        ["http://up.test/api/v1/comment/list?aweme_id=7312345678901234567&count=3&cursor=0"]
    );
    let done = done.unwrap();
    assert_eq!(done.next_cursor.as_deref(), Some("3"));
    let Output::Comments(c) = done.output else {
        panic!()
    };
    assert_eq!(
        c[0],
        Comment {
            id: "7313000000000000001".into(),
            text: "this is art 😭🥐".into(),
            likes: 1022,
            replies: Some(12),
            created_at: plugin_api::Timestamp::from_unix(1_763_700_500),
            author: Some("crumbqueen".into()),
        }
    );
    assert_eq!(c[2].text, r#"the \"sound\" of that crust"#);
    assert_eq!(
        (c[2].replies, c[2].author.as_deref()),
        (Some(0), Some("asmr_tim"))
    );
}

#[test]
fn comments_page_the_upstream_fifty_at_a_time() {
    let total = 811u64;
    let (requests, done) = drive(comments_call(120), move |request| {
        let param = |name: &str| -> u64 {
            let (_, query) = request.url().split_once('?').unwrap();
            let pair = query
                .split('&')
                .find_map(|p| p.strip_prefix(&format!("{name}=")));
            pair.unwrap().parse().unwrap()
        };
        let (cursor, count) = (param("cursor"), param("count"));
        let end = (cursor + count).min(total);
        let items: Vec<_> = (cursor..end)
            .map(|n| json!({"cid": n.to_string(), "text": format!("c{n}"), "digg_count": n}))
            .collect();
        json!({"status_code":0,"comments":items,"cursor":end,"has_more":u8::from(end < total)})
            .to_string()
    });
    let asked: Vec<&str> = urls(&requests)
        .into_iter()
        .map(|u| u.split_once("count=").unwrap().1)
        .collect();
    assert_eq!(asked, ["50&cursor=0", "50&cursor=50", "20&cursor=100"]);
    let done = done.unwrap();
    assert_eq!(done.next_cursor.as_deref(), Some("120"));
    let Output::Comments(c) = done.output else {
        panic!()
    };
    assert_eq!((c.len(), c[119].id.as_str()), (120, "119"));
}

#[test]
fn comments_null_or_empty_is_an_empty_page_absent_is_a_soft_block() {
    for list in ["null", "[]"] {
        let body = format!(r#"{{"status_code":0,"comments":{list},"cursor":0,"has_more":1}}"#);
        assert_eq!(comments(&body).unwrap(), (vec![], None));
    }
    let absent = r#"{"status_code":0,"cursor":0,"has_more":0}"#;
    assert_eq!(kind(comments(absent)), ErrorKind::BadResponse);
    let err = comments(r#"{"status_code":0,"comments":[{"cid":"1","text":"x"}]}"#).unwrap_err();
    assert_eq!(err, ProviderError::missing("digg_count"));
}

#[test]
fn status_codes_classify() {
    assert_eq!(kind(profile(NO_USER)), ErrorKind::NotFound);
    assert_eq!(
        kind(replay(posts_call(None), &[NO_USER]).1),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(replay(posts_call(None), &[PROFILE, NO_USER]).1),
        ErrorKind::NotFound
    );
    assert_eq!(kind(comments(NO_VIDEO)), ErrorKind::NotFound);
    assert_eq!(kind(post(NO_VIDEO)), ErrorKind::NotFound);
    assert_eq!(kind(post(DETAIL_NULL)), ErrorKind::NotFound);
    for outcome in [
        kind(profile(TRY_AGAIN)),
        kind(replay(posts_call(None), &[PROFILE, TRY_AGAIN]).1),
        kind(post(TRY_AGAIN)),
        kind(comments(TRY_AGAIN)),
    ] {
        assert_eq!(outcome, ErrorKind::Transient);
    }
}

#[test]
fn soft_blocks_and_odd_bodies_are_bad_responses_never_not_found() {
    let odd = [
        SOFT_BLOCK,
        r#"{"status_code":0,"user":null}"#,
        r#"{"status_code":0,"aweme_detail":null}"#,
        r#"{"status_code":10000,"status_msg":"key sk-test-4f1c9e is invalid"}"#,
        r#"{"user":{},"aweme_list":[],"aweme_detail":{},"comments":[]}"#,
        r#"{"status_code":"0"}"#,
        "",
        "<html>blocked</html>",
    ];
    for body in odd {
        assert_eq!(kind(profile(body)), ErrorKind::BadResponse, "{body}");
        assert_eq!(
            kind(replay(posts_call(None), &[body]).1),
            ErrorKind::BadResponse,
            "{body}"
        );
        assert_eq!(
            kind(replay(posts_call(None), &[PROFILE, body]).1),
            ErrorKind::BadResponse,
            "{body}"
        );
        assert_eq!(kind(post(body)), ErrorKind::BadResponse, "{body}");
        assert_eq!(kind(comments(body)), ErrorKind::BadResponse, "{body}");
    }
}

#[test]
fn gateway_statuses_pass_through() {
    for (status, want) in [
        (401, ErrorKind::KeyRejected),
        (403, ErrorKind::KeyRejected),
        (429, ErrorKind::RateLimited),
        (503, ErrorKind::Transient),
    ] {
        let mut attempt = kit().begin(&profile_call());
        assert!(matches!(attempt.step(None), Ok(Next::Fetch(_))));
        let err = attempt.step(Some(UpstreamResponse::new(status, &[], PROFILE.as_bytes())));
        assert_eq!(err.unwrap_err().kind(), want, "{status}");
    }
}

#[test]
fn stepping_out_of_order_fails() {
    let mut attempt = kit().begin(&posts_call(None));
    let response = UpstreamResponse::new(200, &[], PROFILE.as_bytes());
    assert_eq!(
        attempt.step(Some(response)).unwrap_err().kind(),
        ErrorKind::BadResponse
    );
}

#[test]
fn keeps_the_hosts_rules() {
    let upstream = Upstream::by_path([
        ("/v1/user/profile", Reply::ok(PROFILE)),
        ("/v1/user/posts", Reply::ok(POSTS)),
        ("/v1/aweme/detail", Reply::ok(DETAIL)),
        ("/v1/comment/list", Reply::ok(COMMENTS)),
    ]);
    let no_user = Upstream::always(Reply::ok(NO_USER));
    let no_video = Upstream::always(Reply::ok(NO_VIDEO));
    let report = kit()
        .conformance()
        .case(Case::new(profile_call(), upstream.clone()).not_found(no_user.clone()))
        .case(Case::new(posts_call(None), upstream.clone()).not_found(no_user))
        .case(Case::new(post_call(), upstream.clone()).not_found(no_video.clone()))
        .case(Case::new(comments_call(3), upstream).not_found(no_video))
        .run();
    report.assert_passes();
}
