//! The made-up provider through the test kit: the conformance suite, and
//! its two kinds of 404.

use plugin_api::testing::conformance::Case;
use plugin_api::testing::{sample, HostSees, Kit, Reply, Upstream};
use plugin_api::{Endpoint, ErrorKind};

use crate::Madeup;

fn kit() -> Kit {
    Kit::new::<Madeup>(serde_json::json!({})).unwrap()
}

fn zed() -> Upstream {
    Upstream::replies([Reply::ok(
        r#"{"handle": "zed", "name": "Zed Made-Up", "fans": "1234"}"#,
    )])
}

#[test]
fn keeps_the_hosts_rules() {
    let no_such = Upstream::replies([Reply::status(404, r#"{"error": "not found"}"#)]);
    kit()
        .conformance()
        .case(Case::new(sample(Endpoint::Profile), zed()).not_found(no_such))
        .run()
        .assert_passes();
}

#[test]
fn a_bare_404_asks_the_next_provider_without_blame() {
    let run = kit().run(
        &sample(Endpoint::Profile),
        &Upstream::replies([Reply::status(404, "<html>Not Found</html>")]),
    );
    assert_eq!(run.kind(), Some(ErrorKind::Undecided));
    assert_eq!(
        run.host_sees(Endpoint::Profile),
        HostSees::NextProvider {
            counts_against_breaker: false
        }
    );
}

#[test]
fn usernames_are_path_segments() {
    let run = kit().run(
        &plugin_api::Call::Profile {
            username: "a.b_c".into(),
        },
        &zed(),
    );
    assert_eq!(run.urls(), ["http://upstream.test/api/users/a.b_c"]);
    let dots = plugin_api::Call::Profile {
        username: "..".into(),
    };
    let run = kit().run(&dots, &Upstream::none());
    assert!(run.requests.is_empty());
    assert_eq!(run.kind(), Some(ErrorKind::InvalidInput));
}
