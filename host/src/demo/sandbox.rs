//! Upstream doubles for `socialgate demo`: two in-process HTTP servers imitating the
//! `shortvideo` primary and fallback providers as fixtures/upstreams/CONTRACT.md describes
//! them (auth headers, routes, payload shapes, error bodies and their traps), so the real
//! plugins can be pointed at them with no network and no real keys. The primary's video
//! search (P5) is left out: its plugin never asks for it. What the plugins read from both
//! is checked through a running demo (`tests/tests/cli.rs`).
//!
//! Both doubles serve one small catalogue, built in code below, each in its own shape.
//! Anything not in it is unknown: a user such as `nosuchuser`, a post such as
//! `7000000000000000000`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::server::{Hardening, Listening};

/// The keys the doubles accept (the demo sets these as the providers' upstream keys).
pub const PRIMARY_KEY: &str = "sandbox-primary-key";
pub const FALLBACK_KEY: &str = "sandbox-fallback-key";

// ---- Catalogue: the data both doubles serve ------------------------------------------

struct User {
    uid: &'static str,
    name: &'static str,
    nickname: &'static str,
    bio: &'static str,
    /// Non-empty = verified (primary `enterprise_verify_reason`, fallback `verified`).
    verified: &'static str,
    followers: u64,
    following: u64,
    likes: u64,
    /// Newest first.
    posts: &'static [Post],
}

struct Post {
    /// 19 ASCII digits, so the slices taken of it below are in bounds.
    id: &'static str,
    /// Unix seconds.
    time: u64,
    duration_ms: u64,
    plays: u64,
    likes: u64,
    shares: u64,
    desc: &'static str,
    /// Hand-written comments, oldest first: (commenter, text, likes, replies).
    comments: &'static [(&'static str, &'static str, u64, u64)],
    /// Generated comments that follow the hand-written ones.
    more: usize,
}

#[rustfmt::skip]
const USERS: &[User] = &[
    User { uid: "6613926240453148678", name: "lunabakes", nickname: "Luna Bakes 🍰",
        bio: "Pastry chef • new recipe every Tuesday\n#baking #dessert",
        verified: "Verified account", followers: 5_479_588, following: 154, likes: 98_989_516,
        posts: &[
        Post { id: "7312345678901234567", time: 1763700000, duration_ms: 15379, plays: 1_203_344,
            likes: 45_312, shares: 530,
            desc: "#baking croissants at 3am 🥐 \"lamination\" is a lifestyle",
            comments: &[("crumbqueen", "this is art 😭🥐", 1022, 12),
                ("hungry.dev", "recipe??", 87, 1),
                ("asmr_tim", r#"the \"sound\" of that crust"#, 5, 0)], more: 117 },
        Post { id: "7312345678901234001", time: 1763100000, duration_ms: 31000, plays: 310_200,
            likes: 9_120, shares: 88, desc: "Tuesday recipe: matcha tart 🍵✨ #dessert #matcha",
            comments: &[("lunabakes", "@matcha.mia thank you!! 💚", 95, 0)], more: 2 },
        Post { id: "7312345678901230002", time: 1762500000, duration_ms: 58123, plays: 40_021,
            likes: 1_200, shares: 3, desc: "reply to @sam: yes you can freeze it\nlink in bio",
            comments: &[("sam.cooks", "omg thank you for answering", 12, 1)], more: 1 },
        Post { id: "7312345678901229876", time: 1761900000, duration_ms: 22450, plays: 88_120,
            likes: 4_410, shares: 61, desc: "sourdough starter day 7 — meet \"Gerald\" 🫧",
            comments: &[("crumbqueen", "Gerald is thriving 😂", 230, 4)], more: 3 },
        Post { id: "7312345678901228800", time: 1761300000, duration_ms: 47800, plays: 512_000,
            likes: 20_100, shares: 940, desc: "3 macaron mistakes 🍪\n1. oven temp\n2. humidity",
            comments: &[("trailrunner.mo", "carb loading inspo 🏃‍♂️", 18, 1)], more: 4 },
    ] },
    User { uid: "6799012345678901234", name: "trailrunner.mo", nickname: "Mo | Trail Runner 🏔️",
        bio: "ultra runner, 100mi finisher x3\n\"run slow, run far\"", verified: "",
        followers: 207_912, following: 612, likes: 3_456_789, posts: &[
        Post { id: "7298765432109876543", time: 1763500000, duration_ms: 12000, plays: 98_311,
            likes: 7_420, shares: 102, desc: "sunrise on the ridge 🌄 mile 42 of 100 #ultrarunning",
            comments: &[("lunabakes", "this view!! 😍", 51, 1)], more: 2 },
        Post { id: "7298765432109870011", time: 1762800000, duration_ms: 64300, plays: 41_200,
            likes: 2_301, shares: 77, desc: r"gear check \ what's in my vest (12 items, <2kg)",
            comments: &[("night.owl.eats", "where is the snack pocket", 9, 0)], more: 1 },
        Post { id: "7298765432109860022", time: 1761000000, duration_ms: 95000, plays: 230_500,
            likes: 15_800, shares: 410, desc: "DNF'd at mile 71. here's what went wrong 👇",
            comments: &[("sam.cooks", "respect for sharing this", 140, 3)], more: 5 },
    ] },
    User { uid: "7000000000000000001", name: "lunabakes.fan", nickname: "luna fan page", bio: "",
        verified: "", followers: 1_215, following: 20, likes: 5_030, posts: &[
        Post { id: "7320000000000000011", time: 1763650000, duration_ms: 17000, plays: 3_100,
            likes: 240, shares: 2, desc: "Luna's croissant tutorial but I burned them 🔥😅",
            comments: &[("crumbqueen", "we've all been there", 3, 0)], more: 1 },
        Post { id: "7320000000000000022", time: 1762900000, duration_ms: 41000, plays: 1_900,
            likes: 120, shares: 1, desc: "ranking every @lunabakes recipe I've tried (so far)",
            comments: &[], more: 2 },
    ] },
];

const MORE_TEXTS: &[&str] = &[
    "need this recipe 🙏",
    "watching this at 2am again",
    "the sound 😩",
    "saving for the weekend 📌",
    "ok but \"lamination\" is my new word",
    "first try, it worked!!",
];
const MORE_AUTHORS: &[&str] = &[
    "crumbqueen",
    "hungry.dev",
    "asmr_tim",
    "matcha.mia",
    "sam.cooks",
];

struct Comment {
    cid: String,
    text: String,
    time: u64,
    likes: u64,
    replies: u64,
    author: &'static str,
}

fn comment_total(p: &Post) -> usize {
    p.comments.len() + p.more
}

/// A post's comments, oldest first: the hand-written ones, then the generated ones.
fn comments(p: &Post) -> Vec<Comment> {
    let written = p
        .comments
        .iter()
        .map(|&(by, text, likes, re)| (by, text.into(), likes, re));
    let more = (0..p.more).map(|i| {
        let text = format!("{} ({})", MORE_TEXTS[i % MORE_TEXTS.len()], i + 1);
        let by = MORE_AUTHORS[i % MORE_AUTHORS.len()];
        (by, text, i as u64 * 37 % 500, u64::from(i % 4 == 0))
    });
    let all = written.chain(more).enumerate();
    let comment = |(i, (author, text, likes, replies))| Comment {
        cid: format!("7313{}{i:04}", &p.id[8..]), // 4 + 11 + 4 = 19 digits
        time: p.time + 97 * (i as u64 + 1),
        text,
        likes,
        replies,
        author,
    };
    all.map(comment).collect()
}

fn find_user(name: &str) -> Option<&'static User> {
    let name = name.trim_start_matches('@');
    USERS.iter().find(|u| u.name.eq_ignore_ascii_case(name))
}

fn find_sec_uid(sec: &str) -> Option<&'static User> {
    USERS.iter().find(|u| sec_uid(u.uid) == sec)
}

fn all_posts() -> impl Iterator<Item = (&'static User, &'static Post)> {
    USERS
        .iter()
        .flat_map(|u| u.posts.iter().map(move |p| (u, p)))
}

fn find_post(id: &str) -> Option<(&'static User, &'static Post)> {
    all_posts().find(|(_, p)| p.id == id)
}

/// A catalogue user's uid, or a stable made-up one for a commenter known only by name.
fn uid_of(name: &'static str) -> (String, &'static str) {
    if let Some(u) = find_user(name) {
        return (u.uid.into(), u.nickname);
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (format!("69{:017}", hash % 10_u64.pow(17)), name)
}

fn sec_uid(uid: &str) -> String {
    format!("MS4wLjABAAAA{uid}")
}

/// The fallback's rounding of big counters: 5479588 -> 5500000, 207912 -> 207900.
fn rounded(n: u64) -> u64 {
    let step = match n {
        1_000_000.. => 100_000,
        1_000.. => 100,
        _ => 1,
    };
    (n + step / 2) / step * step
}

// ---- Shared helpers ------------------------------------------------------------------

struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v)
    }
    fn num(&self, name: &str, default: u64) -> u64 {
        self.get(name).parse().unwrap_or(default)
    }
}

/// One page by offset: `cursor` is the offset, `count` is clamped to 1..=`cap`.
struct Page<T> {
    items: Vec<T>,
    next: usize,
    more: bool,
    total: usize,
}

fn page<T>(items: Vec<T>, q: &Query, default: u64, cap: u64) -> Page<T> {
    let offset = usize::try_from(q.num("cursor", 0)).unwrap_or(usize::MAX);
    let count = q.num("count", default).clamp(1, cap) as usize;
    let total = items.len();
    let items: Vec<T> = items.into_iter().skip(offset).take(count).collect();
    let next = offset.min(total) + items.len();
    Page {
        items,
        next,
        more: next < total,
        total,
    }
}

fn list<T>(items: &[T], f: impl FnMut(&T) -> Value) -> Value {
    Value::Array(items.iter().map(f).collect())
}

/// Posts paged by time, as both providers do: the cursor is the last post's time in ms.
fn ms(p: &Post) -> u64 {
    p.time * 1000
}

fn posts_before(u: &'static User, cursor_ms: u64) -> Vec<&'static Post> {
    u.posts
        .iter()
        .filter(|p| cursor_ms == 0 || ms(p) < cursor_ms)
        .collect()
}

// ---- Primary: mobile "aweme" JSON ----------------------------------------------------

fn primary_ok(mut body: Value) -> Value {
    body["status_code"] = json!(0);
    body["extra"] =
        json!({"now": 1763790000000_u64, "logid": "2025112205000001018907", "fatal_item_ids": []});
    body
}

/// A user object; `counters` is false for authors embedded in posts and comments.
fn primary_user(u: &User, counters: bool) -> Value {
    let n = |v: u64| if counters { v } else { 0 };
    let avatar = |size: u32| {
        json!({"uri": format!("tos-maliva-avt-0068/{}", u.uid),
        "url_list": [format!("https://p16-sign-va.cdn.example/{}~c5_{size}x{size}.webp", u.uid)]})
    };
    json!({"uid": u.uid, "short_id": "0", "unique_id": u.name, "nickname": u.nickname,
        "signature": u.bio, "sec_uid": sec_uid(u.uid), "region": "US", "verification_type": 1,
        "custom_verify": "", "enterprise_verify_reason": u.verified,
        "follower_count": n(u.followers), "following_count": n(u.following),
        "total_favorited": n(u.likes), "aweme_count": n(u.posts.len() as u64),
        "avatar_thumb": avatar(100), "avatar_larger": avatar(1080)})
}

fn aweme(u: &User, p: &Post) -> Value {
    let music = format!("79{}", &p.id[2..]);
    json!({"aweme_id": p.id, "desc": p.desc, "create_time": p.time, "region": "US", "is_top": 0,
        "group_id": p.id, "author_user_id": u.uid.parse::<u64>().ok(), // a bare integer
        "author": primary_user(u, false),
        "statistics": {"aweme_id": p.id, "comment_count": comment_total(p), "digg_count": p.likes,
            "play_count": p.plays, "share_count": p.shares, "collect_count": p.likes / 20},
        "video": {"duration": p.duration_ms, "width": 576, "height": 1024, "ratio": "540p",
            "cover": {"url_list": [format!("https://p16-sign-va.cdn.example/{}.jpeg", p.id)]},
            "play_addr": {"url_list": [format!("https://v16.cdn.example/video/{}.mp4", p.id)]}},
        "music": {"id": music.parse::<u64>().ok(), "id_str": music,
            "title": format!("original sound - {}", u.name), "duration": p.duration_ms / 1000},
        "text_extra": [],
        "share_url": format!("https://www.shortvideo.example/@{}/video/{}", u.name, p.id)})
}

fn primary_comment(c: &Comment, aweme_id: &str) -> Value {
    let (uid, nickname) = uid_of(c.author);
    json!({"cid": c.cid, "text": c.text, "aweme_id": aweme_id, "create_time": c.time,
        "digg_count": c.likes, "status": 1, "reply_comment_total": c.replies, "reply_comment": null,
        "user": {"uid": uid, "unique_id": c.author, "nickname": nickname, "sec_uid": sec_uid(&uid),
            "follower_count": 0, "verification_type": 1, "custom_verify": ""}})
}

/// The contract's error bodies, as its sample payloads (the fixtures the
/// tests' doubles serve too) have them: one copy of each, read once.
mod contract_errors {
    use std::sync::LazyLock;

    use serde_json::Value;

    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).expect("the contract's fixtures are JSON")
    }

    pub static PRIMARY_NO_USER: LazyLock<Value> = LazyLock::new(|| {
        parsed(include_str!(
            "../../../fixtures/upstreams/primary/error_user_not_found.json"
        ))
    });
    pub static PRIMARY_NO_VIDEO: LazyLock<Value> = LazyLock::new(|| {
        parsed(include_str!(
            "../../../fixtures/upstreams/primary/error_video_unavailable.json"
        ))
    });
    pub static FALLBACK_NO_USER: LazyLock<Value> = LazyLock::new(|| {
        parsed(include_str!(
            "../../../fixtures/upstreams/fallback/error_user_not_found.json"
        ))
    });
    pub static FALLBACK_NO_VIDEO: LazyLock<Value> = LazyLock::new(|| {
        parsed(include_str!(
            "../../../fixtures/upstreams/fallback/error_video_not_found.json"
        ))
    });
}

fn primary_route(path: &str, q: &Query) -> Option<Value> {
    let no_user = || contract_errors::PRIMARY_NO_USER.clone();
    Some(match path {
        "/v1/user/profile" => match find_user(q.get("unique_id")) {
            Some(u) => primary_ok(json!({"user": primary_user(u, true)})),
            None => no_user(),
        },
        "/v1/user/posts" => match find_sec_uid(q.get("sec_user_id")) {
            Some(u) => {
                let count = match q.num("count", 20) {
                    0 => 20,
                    n @ 1..=4 => n + 2, // the contract's "up to two more than asked"
                    n => n.min(30),
                };
                let cursor = q.num("max_cursor", 0);
                let older = posts_before(u, cursor);
                let shown = &older[..older.len().min(count as usize)];
                primary_ok(json!({"aweme_list": list(shown, |p| aweme(u, p)),
                    "max_cursor": shown.last().map_or(cursor, |p| ms(p)),
                    "min_cursor": shown.first().map_or(cursor, |p| ms(p)),
                    "has_more": u8::from(older.len() > shown.len())}))
            }
            None => no_user(),
        },
        "/v1/aweme/detail" => match find_post(q.get("aweme_id")) {
            Some((u, p)) => primary_ok(json!({"aweme_detail": aweme(u, p)})),
            None => primary_ok(json!({"aweme_detail": null, "filter_detail": {
                "aweme_id": q.get("aweme_id"), "filter_reason": "status_deleted",
                "detail_msg": ""}})),
        },
        "/v1/comment/list" => match find_post(q.get("aweme_id")) {
            Some((_, p)) => {
                let pg = page(comments(p), q, 20, 50);
                primary_ok(
                    json!({"comments": list(&pg.items, |c| primary_comment(c, p.id)),
                    "cursor": pg.next, "has_more": u8::from(pg.more), "total": pg.total}),
                )
            }
            None => contract_errors::PRIMARY_NO_VIDEO.clone(),
        },
        _ => return None,
    })
}

// ---- Fallback: {code,msg,data} wrapper -----------------------------------------------

fn fallback_ok(data: Value) -> Value {
    json!({"code": 0, "msg": "success", "processed_time": 0.3106, "data": data})
}

/// F1/F5 `{user, stats}`, camelCase, with rounded follower and heart counts.
fn fallback_user(u: &User) -> Value {
    let avatar = |size: u32| {
        format!(
            "https://p16-sign-sg.cdn.example/aweme/{size}x{size}/{}.jpeg",
            u.uid
        )
    };
    json!({"user": {"id": u.uid, "uniqueId": u.name, "nickname": u.nickname, "signature": u.bio,
            "avatarThumb": avatar(100), "avatarLarger": avatar(1080), "secUid": sec_uid(u.uid),
            "verified": !u.verified.is_empty(), "secret": false, "privateAccount": false},
        "stats": {"followingCount": u.following, "followerCount": rounded(u.followers),
            "heartCount": rounded(u.likes), "heart": rounded(u.likes),
            "videoCount": u.posts.len()}})
}

/// An F2/F3 video, snake_case. The post ID goes under `id_key` (`video_id` in F2, `id` in
/// F3); `aweme_id` is the opaque media key (the contract's ID trap).
fn fallback_video(u: &User, p: &Post, id_key: &str) -> Value {
    json!({id_key: p.id, "aweme_id": format!("v15044gf0000d7{}og65ug", &p.id[12..]),
        "region": "US", "title": p.desc, "duration": p.duration_ms / 1000, "create_time": p.time,
        "cover": format!("https://p16.cdn.example/{}.jpeg", p.id),
        "play": format!("https://v16.cdn.example/{}.mp4", p.id),
        "music_info": {"id": format!("79{}", &p.id[2..]),
            "title": format!("original sound - {}", u.name)},
        "play_count": p.plays, "digg_count": p.likes, "comment_count": comment_total(p),
        "share_count": p.shares, "collect_count": p.likes / 20, "is_ad": false, "is_top": 0,
        "author": {"id": u.uid, "unique_id": u.name, "nickname": u.nickname}})
}

fn fallback_comment(c: &Comment) -> Value {
    let (uid, nickname) = uid_of(c.author);
    json!({"id": c.cid, "text": c.text, "create_time": c.time, "digg_count": c.likes,
        "reply_total": c.replies, "status": 1,
        "user": {"id": uid, "sec_uid": sec_uid(&uid), "unique_id": c.author, "nickname": nickname,
            "aweme_count": 0, "follower_count": 0, "total_favorited": 0}})
}

/// F3/F4 `url`: a bare post ID or a share URL ending in one.
fn fallback_post(q: &Query) -> Option<(&'static User, &'static Post)> {
    let url = q.get("url").split('?').next().unwrap_or_default();
    find_post(
        url.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default(),
    )
}

fn fallback_route(path: &str, q: &Query) -> Option<Value> {
    let no_user = || contract_errors::FALLBACK_NO_USER.clone();
    let no_video = || contract_errors::FALLBACK_NO_VIDEO.clone();
    Some(match path {
        "/user/info" => {
            find_user(q.get("unique_id")).map_or_else(no_user, |u| fallback_ok(fallback_user(u)))
        }
        "/user/posts" => match find_user(q.get("unique_id")) {
            Some(u) => {
                let older = posts_before(u, q.num("cursor", 0));
                let batch = &older[..older.len().min(5)]; // a fixed batch: `count` is ignored
                fallback_ok(
                    json!({"videos": list(batch, |p| fallback_video(u, p, "video_id")),
                    "cursor": batch.last().map_or(0, |p| ms(p)).to_string(),
                    "hasMore": older.len() > batch.len()}),
                )
            }
            None => no_user(),
        },
        "/" => match fallback_post(q) {
            Some((u, p)) => {
                let mut video = fallback_video(u, p, "id");
                video["hdplay"] = json!(format!("https://v16.cdn.example/{}-hd.mp4", p.id));
                fallback_ok(video)
            }
            None => no_video(),
        },
        "/comment/list" => match fallback_post(q) {
            Some((_, p)) => {
                let pg = page(comments(p), q, 10, 50);
                fallback_ok(json!({"comments": list(&pg.items, fallback_comment),
                    "total": pg.total, "cursor": pg.next, "hasMore": pg.more}))
            }
            None => no_video(),
        },
        "/user/search" => {
            let kw = q.get("keywords").to_lowercase();
            let hits = USERS.iter().filter(|u| {
                [u.name, u.nickname]
                    .iter()
                    .any(|s| s.to_lowercase().contains(&kw))
            });
            let pg = page(hits.collect(), q, 10, 30);
            fallback_ok(json!({"user_list": list(&pg.items, |u| fallback_user(u)),
                "cursor": pg.next, "hasMore": pg.more}))
        }
        _ => return None,
    })
}

// ---- Serving -------------------------------------------------------------------------

/// One double: the key it accepts, its routes, and whether it answers everything with 503
/// (checked before the key, as a gateway in front of it would).
#[derive(Debug, Clone, Copy)]
struct Double {
    name: &'static str,
    key_header: &'static str,
    key: &'static str,
    route: fn(&str, &Query) -> Option<Value>,
    fail: bool,
}

/// The two running doubles. Dropping it stops both, open connections included.
#[derive(Debug)]
pub struct Sandbox {
    /// The primary double's base URL, `http://127.0.0.1:PORT` (no trailing `/`).
    pub primary_url: String,
    /// The fallback double's base URL, `http://127.0.0.1:PORT` (no trailing `/`).
    pub fallback_url: String,
    shutdown: CancellationToken,
}

impl Sandbox {
    /// Binds both doubles on 127.0.0.1 with OS-chosen ports and serves them on the current
    /// tokio runtime until dropped. `fail_primary`: the primary answers every request with
    /// HTTP 503 (to watch failover).
    pub async fn start(fail_primary: bool) -> std::io::Result<Sandbox> {
        let primary = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let fallback = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let primary_url = format!("http://{}", primary.local_addr()?);
        let fallback_url = format!("http://{}", fallback.local_addr()?);
        let p = Double {
            name: "primary",
            key_header: "x-api-key",
            key: PRIMARY_KEY,
            route: primary_route,
            fail: fail_primary,
        };
        let f = Double {
            name: "fallback",
            key_header: "x-rapidapi-key",
            key: FALLBACK_KEY,
            route: fallback_route,
            fail: false,
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(primary, p, shutdown.clone()));
        tokio::spawn(serve(fallback, f, shutdown.clone()));
        debug!(%primary_url, %fallback_url, fail_primary, "sandbox upstreams listening");
        Ok(Sandbox {
            primary_url,
            fallback_url,
            shutdown,
        })
    }

    /// For the demo's printed examples: a user, and her post with 120
    /// comments.
    pub fn example() -> (&'static str, &'static str) {
        (USERS[0].name, USERS[0].posts[0].id)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves one double with the host's own connection helper, until the
/// sandbox is dropped.
async fn serve(listener: TcpListener, double: Double, shutdown: CancellationToken) {
    let handler = move |req: Request<Incoming>| async move { handle(double, &req) };
    let listening = Listening::new("sandbox", Hardening::default(), None);
    crate::server::serve(listening, listener, shutdown, None, handler).await
}

fn handle(double: Double, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body) = answer(double, req);
    debug!(
        double = double.name,
        path = req.uri().path(),
        status = status.as_u16(),
        "sandbox request"
    );
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn answer(double: Double, req: &Request<Incoming>) -> (StatusCode, Value) {
    let key = req
        .headers()
        .get(double.key_header)
        .and_then(|v| v.to_str().ok());
    let refuse = |status, message| (status, json!({ "message": message }));
    if double.fail {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable");
    }
    if key != Some(double.key) {
        return refuse(StatusCode::UNAUTHORIZED, "Invalid API key");
    }
    if req.method() != Method::GET {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let query = form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes());
    match (double.route)(req.uri().path(), &Query(query.into_owned().collect())) {
        Some(body) => (StatusCode::OK, body),
        None => refuse(StatusCode::NOT_FOUND, "Not Found"),
    }
}
