//! The kit on small providers written here: one that keeps every rule, and
//! ones that break one each.

use super::conformance::{Case, Rule};
use super::*;
use crate::{attempt, Attempt, Output, Profile};
use serde::Deserialize;
use serde_json::json;

/// How a [`Toy`] misbehaves.
#[derive(Deserialize, Default, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Flaw {
    #[default]
    None,
    PanicOnOddBody,
    Loops,
    WrongEndpoint,
    InvalidAfterFetch,
    /// Not a flaw: answers with the headers it was lent as the display name.
    EchoHeaders,
    /// Its first step in this process takes longer than the host allows.
    SlowOnce,
    /// Refuses every username, quoting its upstream key.
    QuotesKey,
    /// Fails an upstream user whose handle is not the one asked for,
    /// quoting the handle (upstream text, which may be anything).
    QuotesHandle,
    /// Asks a host of its own, not its `base_url`'s.
    ForeignHost,
    /// Sets `Host`, which the host writes itself.
    HostHeader,
    /// Logs its upstream key as each attempt begins.
    LogsKey,
}

#[derive(Deserialize, Default)]
struct Settings {
    #[serde(default)]
    flaw: Flaw,
}

/// Serves `profile` from `GET /users/{username}`; 404 means no such user.
struct Toy {
    config: ProviderConfig,
    flaw: Flaw,
}

#[derive(Deserialize)]
struct User {
    handle: String,
    /// The display name; none when absent.
    #[serde(default)]
    name: String,
}

fn profile(handle: String) -> Output {
    Output::Profile(profile_of(handle))
}

fn profile_of(handle: String) -> Profile {
    Profile {
        username: handle,
        display_name: String::new(),
        followers: 0,
        verified: false,
        id: None,
        bio: None,
        following: None,
        likes: None,
        videos: None,
        avatar_url: None,
    }
}

struct Loop(UpstreamRequest);

impl Attempt for Loop {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        Ok(Next::Fetch(self.0.clone()))
    }
}

impl Provider for Toy {
    fn manifest() -> Manifest {
        Manifest {
            name: "toy".into(),
            version: "0.1.0".into(),
            platform: "toy".into(),
            endpoints: vec![Endpoint::Profile],
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        let Settings { flaw } = config.settings()?;
        Ok(Toy { config, flaw })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        let Call::Profile { username } = call else {
            return attempt::fail(ProviderError::new(ErrorKind::Unsupported, "profile only"));
        };
        let flaw = self.flaw;
        if flaw == Flaw::LogsKey {
            crate::warn!("asking with key {}", self.config.api_key);
        }
        if flaw == Flaw::QuotesKey {
            let why = format!("is refused by key {}", self.config.api_key);
            return attempt::fail(ProviderError::invalid_input("username", why));
        }
        attempt::start(|| {
            let base_url = match flaw {
                Flaw::ForeignHost => "http://cdn.upstream.test/api",
                _ => &self.config.base_url,
            };
            let mut request = UpstreamRequest::get(base_url, "/users")
                .segment(&username)?
                .bearer(&self.config.api_key);
            if flaw == Flaw::HostHeader {
                request = request.header("Host", "api.upstream.test");
            }
            if flaw == Flaw::Loops {
                return Ok(Box::new(Loop(request)));
            }
            Ok(attempt::single(request, move |r| {
                if flaw == Flaw::InvalidAfterFetch {
                    return Err(ProviderError::invalid_input("username", "is odd"));
                }
                if flaw == Flaw::PanicOnOddBody && r.body.is_empty() {
                    panic!("an empty body");
                }
                static SLEPT: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if flaw == Flaw::SlowOnce && !SLEPT.swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    std::thread::sleep(crate::ffi::STEP_BUDGET + Duration::from_millis(20));
                }
                let user: User = r.not_found_on(404, "user")?.json()?;
                if flaw == Flaw::QuotesHandle && user.handle != username {
                    return Err(ProviderError::bad_response(format!(
                        "asked for {username}, got {}",
                        user.handle
                    )));
                }
                let output = match flaw {
                    Flaw::WrongEndpoint => Output::Post(crate::schema::bare_post("1")),
                    Flaw::EchoHeaders => Output::Profile(Profile {
                        display_name: r
                            .headers
                            .iter()
                            .map(|(name, value)| format!("{name}={value}"))
                            .collect::<Vec<_>>()
                            .join(","),
                        ..profile_of(user.handle)
                    }),
                    _ => Output::Profile(Profile {
                        display_name: user.name,
                        ..profile_of(user.handle)
                    }),
                };
                Ok(Done::last(output))
            }))
        })
    }
}

fn kit(flaw: &str) -> Kit {
    Kit::new::<Toy>(json!({ "flaw": flaw })).unwrap()
}

fn user() -> Upstream {
    Upstream::replies([Reply::ok(r#"{"handle":"kit_user"}"#)])
}

fn suite(flaw: &str) -> conformance::Report {
    let kit = kit(flaw);
    kit.conformance()
        .case(
            Case::new(sample(Endpoint::Profile), user())
                .not_found(Upstream::replies([Reply::status(404, "{}")])),
        )
        .run()
}

#[test]
fn a_provider_that_keeps_the_rules_passes() {
    let report = suite("none");
    report.assert_passes();
    assert!(report.runs > 30, "{report}");
}

/// The host keeps the pairs it lends a thread's steps: each step must see
/// its own answer's headers, none left from a longer set before.
#[test]
fn each_step_is_lent_its_own_answers_headers() {
    let kit = kit("echo_headers");
    let body = br#"{"handle":"kit_user"}"#;
    for (lines, seen) in [
        ("a: 1\nbb: 22\nc: 3\n", "a=1,bb=22,c=3"),
        ("d: 4\n", "d=4"),
        ("", ""),
        ("e: 5\nf: 6\n", "e=5,f=6"),
    ] {
        let mut attempt = kit.begin(&sample(Endpoint::Profile));
        assert!(matches!(attempt.step(None), Ok(Next::Fetch(_))));
        let answer = UpstreamResponse::with_header_lines(200, lines, body);
        let Ok(Next::Done(done)) = attempt.step(Some(answer)) else {
            panic!("no answer for {lines:?}");
        };
        let Output::Profile(profile) = done.output else {
            panic!("not a profile");
        };
        assert_eq!(profile.display_name, seen);
    }
}

#[test]
fn runs_go_through_the_boundary_and_report_requests() {
    let kit = kit("none");
    let run = kit.run(&sample(Endpoint::Profile), &user());
    assert_eq!(run.urls(), ["http://upstream.test/api/users/kit_user"]);
    let auth = &run.requests[0].headers()[0];
    assert_eq!(auth.1, format!("Bearer {KEY}"));
    assert_eq!(run.steps, 2);
    assert_eq!(run.host_sees(Endpoint::Profile), HostSees::Answer);
    assert_eq!(run.done().output, profile("kit_user".into()));

    let dots = Call::Profile {
        username: "..".into(),
    };
    let run = kit.run(&dots, &Upstream::none());
    assert!(run.requests.is_empty());
    assert!(matches!(
        run.host_sees(Endpoint::Profile),
        HostSees::InvalidInput(_)
    ));

    let missing = kit.run(
        &sample(Endpoint::Profile),
        &Upstream::replies([Reply::status(404, "")]),
    );
    assert_eq!(missing.host_sees(Endpoint::Profile), HostSees::NotFound);
    let unscripted = kit.run(&sample(Endpoint::Profile), &Upstream::none());
    assert!(unscripted.unscripted);
    assert_eq!(unscripted.kind(), Some(ErrorKind::Transient));
}

#[test]
fn a_panic_comes_back_as_panicked_and_breaks_no_panic() {
    let kit = kit("panic_on_odd_body");
    let run = kit.run(
        &sample(Endpoint::Profile),
        &Upstream::replies([Reply::ok("")]),
    );
    assert_eq!(run.kind(), Some(ErrorKind::Panicked));
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::NextProvider {
            counts_against_breaker: true
        }
    );
    let report = suite("panic_on_odd_body");
    assert!(report.violates(Rule::NoPanic), "{report}");
    assert!(
        report.to_string().contains("rule `no-panic` broken"),
        "{report}"
    );
}

#[test]
fn each_flaw_names_its_rule() {
    for (flaw, rule) in [
        ("loops", Rule::StepCap),
        ("wrong_endpoint", Rule::EveryEndpointAnswers),
        ("invalid_after_fetch", Rule::RefusalsBeforeRequests),
    ] {
        let report = suite(flaw);
        assert!(report.violates(rule), "{flaw}: {report}");
        assert!(report.to_string().contains(rule.name()), "{flaw}: {report}");
    }
    let looping = kit("loops");
    let run = looping.run(
        &sample(Endpoint::Profile),
        &Upstream::always(Reply::ok("{}")),
    );
    assert!(run.capped);
    assert_eq!(run.steps, MAX_STEPS);
    // Sleeps once per process: this is its only suite.
    let slow = suite("slow_once");
    assert!(slow.violates(Rule::StepCap), "{slow}");
    let said = slow.to_string();
    let took: u128 = said
        .split("a call took ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no time in {said}"));
    assert!(took > 1000, "{said}");
    assert!(said.contains("past 1000 ms"), "{said}");
    let wrong = kit("wrong_endpoint");
    let e = wrong.run(&sample(Endpoint::Profile), &user()).error();
    assert!(
        e.message().contains("answered post to a profile call"),
        "{e}"
    );
}

/// Provider-author sweep: the kit passed requests the host always refuses.
#[test]
fn requests_the_host_refuses_are_refused_here_as_the_host_says() {
    for (flaw, said) in [
        ("foreign_host", "outside its provider's base_url origin"),
        (
            "host_header",
            "the request header `Host`, which the host sets itself",
        ),
    ] {
        let run = kit(flaw).run(&sample(Endpoint::Profile), &user());
        assert_eq!(run.requests.len(), 1, "{flaw}: the request is reported");
        assert_eq!(run.kind(), Some(ErrorKind::BadResponse), "{flaw}");
        let error = run.error();
        assert!(error.message().contains(said), "{flaw}: {error}");
        let report = suite(flaw);
        assert!(
            report.violates(Rule::EveryEndpointAnswers),
            "{flaw}: {report}"
        );
    }
    // The origin as the host compares it: case, the default port written.
    let kit = Kit::with_config::<Toy>(ProviderConfig {
        base_url: "HTTP://Upstream.Test:80/api".into(),
        api_key: KEY.into(),
        settings: json!({}),
    })
    .unwrap();
    let run = kit.run(&sample(Endpoint::Profile), &user());
    assert_eq!(run.host_sees(Endpoint::Profile), HostSees::Answer);
    for (url, inside) in [
        ("http://upstream.test/x", true),
        ("http://UPSTREAM.test:80/x?y", true),
        ("https://upstream.test/x", false),
        ("http://upstream.test:8080/x", false),
        ("http://user@upstream.test/x", false),
        ("http://upstream.test.evil/x", false),
        ("http://[::1]:80/x", false),
        ("upstream.test/x", false),
        ("http://upstream.test/a b", false),
        ("http://upstream.test/café", false),
    ] {
        let origin = Origin::of(url);
        assert_eq!(
            origin == Origin::of("http://upstream.test/api/"),
            inside,
            "{url}"
        );
    }
    assert_eq!(
        Origin::of("http://[::1]:8080/x").map(|o| o.port),
        Some(8080)
    );
}

/// Provider-author sweep: the suite read every kit's log lines, so one
/// test's provider logging its key failed another provider's suite.
#[test]
fn a_suite_reads_only_its_own_providers_log_lines() {
    let leaky = kit("logs_key");
    let _ = leaky.run(&sample(Endpoint::Profile), &user());
    assert!(leaky.logs().iter().any(|line| line.contains(KEY)));
    assert!(
        logs().iter().any(|line| line.contains(KEY)),
        "all kits' lines"
    );
    suite("none").assert_passes();
    let report = suite("logs_key");
    assert!(report.violates(Rule::NoKeyInErrors), "{report}");
}

#[test]
fn a_missing_case_and_an_outside_call_are_reported() {
    let kit = kit("none");
    let report = kit.conformance().run();
    assert!(report.violates(Rule::EveryEndpointAnswers), "{report}");
    assert!(!report.violates(Rule::OutsideManifestRefused), "{report}");
}

#[test]
fn host_verdicts_follow_the_host_rules() {
    let run = |kind, requests: usize| Run {
        requests: vec![UpstreamRequest::get("http://u", "/"); requests],
        outcome: Err(ProviderError::new(kind, "x".repeat(300))),
        steps: 1,
        capped: false,
        unscripted: false,
        slowest_call: Duration::ZERO,
        redactor: Redactor::of(KEY),
    };
    let next = |counts| HostSees::NextProvider {
        counts_against_breaker: counts,
    };
    let search = Endpoint::Search;
    assert_eq!(run(ErrorKind::NotFound, 1).host_sees(search), next(true));
    assert_eq!(
        run(ErrorKind::InvalidInput, 0).host_sees(search),
        HostSees::InvalidInput("x".repeat(200))
    );
    assert_eq!(
        run(ErrorKind::InvalidInput, 1).host_sees(search),
        next(true)
    );
    assert_eq!(
        run(ErrorKind::Unsupported, 0).host_sees(search),
        next(false)
    );
    assert_eq!(run(ErrorKind::Unsupported, 1).host_sees(search), next(true));
    assert_eq!(run(ErrorKind::Undecided, 1).host_sees(search), next(false));
    assert_eq!(run(ErrorKind::RateLimited, 1).host_sees(search), next(true));
}

/// The host refuses an answer that holds the upstream key and takes the
/// key out of what a caller reads: the kit shows the same.
#[test]
fn the_key_never_reaches_a_caller_in_the_kit_as_in_the_host() {
    let echoed = Upstream::replies([Reply::ok(format!(r#"{{"handle":"me","name":"me {KEY}"}}"#))]);
    let run = kit("none").run(&sample(Endpoint::Profile), &echoed);
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::NextProvider {
            counts_against_breaker: true
        }
    );
    let error = run.error();
    assert_eq!(error.kind(), ErrorKind::BadResponse);
    assert!(
        error.message().contains("holds the upstream key"),
        "{error}"
    );
    assert!(!error.message().contains(KEY), "{error}");

    let run = kit("quotes_key").run(&sample(Endpoint::Profile), &Upstream::none());
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::InvalidInput("parameter `username` is refused by key [redacted]".into())
    );
    // The author's own bug is still theirs to see, and the suite's to report.
    assert!(run.error().message().contains(KEY));
    let report = suite("quotes_key");
    assert!(report.violates(Rule::NoKeyInErrors), "{report}");
    // Provider-author sweep: one cause was listed once per variation (the
    // key echoed at each status, each body): once now, counted.
    let key_rules: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.rule == Rule::NoKeyInErrors)
        .collect();
    assert_eq!(key_rules.len(), 1, "{report}");
    assert!(
        key_rules[0].detail.contains("more variation(s) alike"),
        "{report}"
    );
}

/// The suite echoes the key into the strings of the case's own first
/// reply, found by the request the provider really makes (`by_path`
/// answers no made-up one).
#[test]
fn the_key_is_echoed_in_the_fields_the_provider_reads() {
    let kit = kit("quotes_handle");
    let upstream = Upstream::by_path([("/users/kit_user", Reply::ok(r#"{"handle":"kit_user"}"#))]);
    let report = kit
        .conformance()
        .case(Case::new(sample(Endpoint::Profile), upstream))
        .run();
    assert!(report.violates(Rule::NoKeyInErrors), "{report}");
}

/// Serves `posts` from `GET /posts?after=CURSOR`, a page of one post and
/// the next cursor `more`; with `drops_cursor`, it never sends the cursor.
struct Pager {
    config: ProviderConfig,
    drops_cursor: bool,
}

#[derive(Deserialize, Default)]
struct PagerSettings {
    #[serde(default)]
    drops_cursor: bool,
}

impl Provider for Pager {
    fn manifest() -> Manifest {
        Manifest {
            name: "pager".into(),
            version: "0.1.0".into(),
            platform: "pager".into(),
            endpoints: vec![Endpoint::Posts],
        }
    }

    fn new(config: ProviderConfig) -> Result<Self, String> {
        let PagerSettings { drops_cursor } = config.settings()?;
        Ok(Pager {
            config,
            drops_cursor,
        })
    }

    fn begin(&self, call: Call) -> Box<dyn Attempt> {
        if call.endpoint() != Endpoint::Posts {
            return attempt::fail(ProviderError::new(ErrorKind::Unsupported, "posts only"));
        }
        let mut request = UpstreamRequest::get(&self.config.base_url, "/posts");
        if let (Some(cursor), false) = (call.cursor(), self.drops_cursor) {
            request = request.query("after", cursor);
        }
        attempt::single(request, |r| {
            r.json::<serde_json::Value>()?;
            Ok(Done {
                output: Output::Posts(vec![crate::schema::bare_post("1")]),
                next_cursor: Some("more".into()),
            })
        })
    }
}

/// Provider-author sweep: a cursor that never reached the upstream passed
/// the suite; callers got the first page again, then the listing ended.
#[test]
fn a_cursor_that_never_reaches_the_upstream_is_reported() {
    let report = |drops_cursor: bool| {
        Kit::new::<Pager>(json!({ "drops_cursor": drops_cursor }))
            .unwrap()
            .conformance()
            .case(Case::new(
                sample(Endpoint::Posts),
                Upstream::always(Reply::ok("{}")),
            ))
            .run()
    };
    report(false).assert_passes();
    let dropped = report(true);
    assert!(dropped.violates(Rule::CursorsRoundTrip), "{dropped}");
    assert!(
        dropped.to_string().contains("never reaches the upstream"),
        "{dropped}"
    );
}
