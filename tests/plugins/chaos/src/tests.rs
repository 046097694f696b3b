//! Each fault through the test kit: what the host sees of it, and the rule
//! of the conformance suite it breaks.

use plugin_api::testing::conformance::{Case, Report, Rule};
use plugin_api::testing::{sample, HostSees, Kit, Reply, Upstream};
use plugin_api::{Endpoint, ErrorKind};

use crate::Chaos;

fn kit(mode: &str) -> Kit {
    Kit::new::<Chaos>(serde_json::json!({ "mode": mode })).unwrap()
}

fn suite(mode: &str) -> Report {
    let kit = kit(mode);
    let upstream = Upstream::always(Reply::ok("{}"));
    let mut suite = kit.conformance();
    for endpoint in Endpoint::ALL {
        suite = suite.case(Case::new(sample(endpoint), upstream.clone()));
    }
    suite.run()
}

#[test]
fn a_panic_comes_back_as_panicked() {
    for mode in ["panic_in_step", "panic_in_begin"] {
        let run = kit(mode).run(&sample(Endpoint::Post), &Upstream::none());
        assert_eq!(run.kind(), Some(ErrorKind::Panicked), "{mode}");
        assert!(run.requests.is_empty());
        let report = suite(mode);
        assert!(report.violates(Rule::NoPanic), "{mode}: {report}");
    }
    let err = Kit::new::<Chaos>(serde_json::json!({"mode": "panic_on_setup"}))
        .err()
        .unwrap();
    assert!(err.contains("panicked"), "{err}");
}

#[test]
fn refusals_before_and_after_a_request() {
    let run = kit("invalid_input").run(&sample(Endpoint::Profile), &Upstream::none());
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::InvalidInput("parameter `username` is not allowed on this platform".into())
    );
    let upstream = Upstream::always(Reply::ok("{}"));
    let run = kit("invalid_after_fetch").run(&sample(Endpoint::Profile), &upstream);
    assert_eq!(run.urls(), ["http://upstream.test/api/anything"]);
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::NextProvider {
            counts_against_breaker: true
        }
    );
    let report = suite("invalid_after_fetch");
    assert!(report.violates(Rule::RefusalsBeforeRequests), "{report}");
    let run = kit("unsupported").run(&sample(Endpoint::Search), &Upstream::none());
    assert_eq!(
        run.host_sees(Endpoint::Search),
        HostSees::NextProvider {
            counts_against_breaker: false
        }
    );
    // Chaos never answers: the suite says so, naming the rule.
    let report = suite("unsupported");
    assert!(report.violates(Rule::EveryEndpointAnswers), "{report}");
    assert!(!report.violates(Rule::NoPanic), "{report}");
}
