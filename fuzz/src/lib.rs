//! The driver behind every fuzz target: a plugin's attempt fed upstream
//! bodies made by the fuzzer, step by step, as the host would feed it.
//!
//! The input is split on `0xFF` (a byte no UTF-8 JSON holds) into one body
//! per upstream response, so multi-request attempts (the primary's posts:
//! profile, then page; comments: several pages) are explored too. A run
//! fails on a panic, an attempt that does not end within [`MAX_STEPS`], a
//! request that is not a GET of the configured upstream, or an answer the
//! host's boundary would refuse: of another endpoint, failing
//! [`Output::check`](plugin_api::Output::check) (list length, ID shapes,
//! handles, avatar URLs), or with a cursor longer than [`MAX_CURSOR_LEN`].

pub use plugin_api::ffi::{MAX_CURSOR_LEN, MAX_STEPS};
use plugin_api::{Call, Next, Provider, ProviderConfig, UpstreamResponse};

/// Sets `P` up as the host would, against an upstream that is never
/// reached: the fuzzer's bytes stand in for every response.
pub fn provider<P: Provider>() -> P {
    let config = ProviderConfig {
        base_url: "https://upstream.test/api".into(),
        api_key: "fuzz-key".into(),
        settings: serde_json::Value::Object(Default::default()),
    };
    P::new(config).unwrap_or_else(|e| panic!("the plugin refuses a plain config: {e}"))
}

/// Drives one attempt at `call` through the bodies in `data`.
pub fn drive<P: Provider>(provider: &P, call: Call, data: &[u8]) {
    let endpoint = call.endpoint();
    let most_items = call.most_items();
    let mut attempt = provider.begin(call);
    let mut bodies = data.split(|&b| b == 0xFF);
    let mut response: Option<&[u8]> = None;
    for _ in 0..MAX_STEPS {
        let step = attempt.step(response.map(|body| UpstreamResponse::new(200, &[], body)));
        match step {
            Err(_) => return,
            Ok(Next::Done(done)) => {
                assert_eq!(
                    done.output.endpoint(),
                    endpoint,
                    "an answer of another endpoint"
                );
                if let Err(broken) = done.output.check(most_items) {
                    panic!("an answer the host refuses: {broken}");
                }
                let cursor = done.next_cursor.as_deref().unwrap_or_default();
                assert!(cursor.len() <= MAX_CURSOR_LEN, "a cursor the host refuses");
                return;
            }
            Ok(Next::Fetch(request)) => {
                assert_eq!(request.method(), "GET");
                assert!(request.url().starts_with("https://upstream.test/api/"));
                match bodies.next() {
                    Some(body) => response = Some(body),
                    // The fuzzer's bytes ran out: as good as a dead upstream.
                    None => return,
                }
            }
        }
    }
    panic!("the attempt did not end within {MAX_STEPS} steps");
}

/// The calls the targets make: the biggest page each endpoint allows, so
/// paged attempts take as many steps as they can.
pub mod calls {
    use plugin_api::Call;

    pub fn profile() -> Call {
        Call::Profile {
            username: "lunabakes".into(),
        }
    }

    pub fn posts(cursor: Option<String>) -> Call {
        Call::Posts {
            username: "lunabakes".into(),
            count: 30,
            cursor,
        }
    }

    pub fn post() -> Call {
        Call::Post {
            id: "7312345678901234567".into(),
        }
    }

    pub fn comments(cursor: Option<String>) -> Call {
        Call::Comments {
            id: "7312345678901234567".into(),
            count: 200,
            cursor,
        }
    }

    pub fn search(cursor: Option<String>) -> Call {
        Call::Search {
            query: "luna".into(),
            count: 30,
            cursor,
        }
    }
}
