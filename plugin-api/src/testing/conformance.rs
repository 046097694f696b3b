//! The conformance suite: the host's rules for providers, checked in one
//! call against the provider's own fixtures.
//!
//! ```text
//! let kit = Kit::new::<Mine>(json!({}))?;
//! kit.conformance()
//!     .case(Case::new(sample(Endpoint::Profile), Upstream::replies([Reply::file("fixtures/user.json")]))
//!         .not_found(Upstream::replies([Reply::file("fixtures/not_found.json")])))
//!     .run()
//!     .assert_passes();
//! ```
//!
//! Each [`Case`] is a call and an upstream that answers it; a case may add
//! the replies that mean "no such user or post" and those of the next page.
//! The suite runs every case, then variations of it (the upstream echoing
//! the key, odd bodies, gateway statuses, many threads at once), and
//! reports each broken [`Rule`] by name.

use std::fmt;

use super::{sample, Kit, Reply, Run, Upstream, MAX_STEPS};
use crate::ffi::{MAX_CALLER_MESSAGE, STEP_BUDGET};
use crate::{Call, Endpoint, ErrorKind};

/// A rule of the host's that a provider must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every endpoint of the manifest has a case, and each case answers.
    EveryEndpointAnswers,
    /// A call for an endpoint outside the manifest fails `unsupported`
    /// without a request.
    OutsideManifestRefused,
    /// "Not found" answers a call that names a resource, given the
    /// upstream's "no such" replies; never a `search`.
    NotFoundOnlyForResources,
    /// No error message and no log line holds the upstream key, even when
    /// the upstream echoes it.
    NoKeyInErrors,
    /// No input makes the provider panic (a panic comes back as
    /// `panicked`, a failed attempt, and is a bug).
    NoPanic,
    /// A next cursor, given back, starts the next page.
    CursorsRoundTrip,
    /// No attempt takes more than the host's [`MAX_STEPS`], and none of the
    /// host's calls into the plugin (`begin` with the first `step`, a later
    /// `step`) runs past its [`STEP_BUDGET`].
    StepCap,
    /// "Invalid input" and "unsupported" come before the first request
    /// (after it, the host counts them as upstream failures).
    RefusalsBeforeRequests,
    /// An "invalid input" message fits what a caller is shown: at most
    /// [`MAX_CALLER_MESSAGE`] characters, one line.
    CallerMessageFits,
    /// Attempts run at once on many threads answer as they do one by one.
    Threads,
}

impl Rule {
    /// The rule's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::EveryEndpointAnswers => "every-endpoint-answers",
            Rule::OutsideManifestRefused => "outside-manifest-refused",
            Rule::NotFoundOnlyForResources => "not-found-only-for-resources",
            Rule::NoKeyInErrors => "no-key-in-errors",
            Rule::NoPanic => "no-panic",
            Rule::CursorsRoundTrip => "cursors-round-trip",
            Rule::StepCap => "step-cap",
            Rule::RefusalsBeforeRequests => "refusals-before-requests",
            Rule::CallerMessageFits => "caller-message-fits",
            Rule::Threads => "threads",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One call and the upstream that answers it.
#[derive(Clone)]
pub struct Case {
    call: Call,
    upstream: Upstream,
    not_found: Option<Upstream>,
    next_page: Option<Upstream>,
}

impl Case {
    /// `call`, which `upstream` answers successfully.
    pub fn new(call: Call, upstream: Upstream) -> Case {
        Case {
            call,
            upstream,
            not_found: None,
            next_page: None,
        }
    }

    /// The upstream's replies when the call's user or post does not exist
    /// (for `search`: replies that must not become "not found").
    pub fn not_found(mut self, upstream: Upstream) -> Case {
        self.not_found = Some(upstream);
        self
    }

    /// The upstream that answers the call continued from its next cursor;
    /// by default the case's own.
    pub fn next_page(mut self, upstream: Upstream) -> Case {
        self.next_page = Some(upstream);
        self
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// What happened, naming the endpoint.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule `{}` broken: {}", self.rule, self.detail)
    }
}

/// What the suite found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every broken rule, in the order found.
    pub violations: Vec<Violation>,
    /// How many attempts the suite ran.
    pub runs: usize,
}

impl Report {
    /// Whether `rule` was broken.
    pub fn violates(&self, rule: Rule) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }

    /// Panics listing every broken rule, unless none was.
    #[track_caller]
    pub fn assert_passes(&self) {
        if !self.violations.is_empty() {
            panic!("{self}");
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.violations.is_empty() {
            return write!(f, "conformance: all rules kept ({} runs)", self.runs);
        }
        writeln!(
            f,
            "conformance: {} rule violation(s) in {} runs:",
            self.violations.len(),
            self.runs
        )?;
        for v in &self.violations {
            writeln!(f, "- {v}")?;
        }
        Ok(())
    }
}

/// The suite for one provider; see the module doc.
pub struct Suite<'k> {
    kit: &'k Kit,
    cases: Vec<Case>,
}

/// A run's outcome reduced to what must not differ between threads.
fn summary(run: &Run) -> Result<String, ErrorKind> {
    match &run.outcome {
        Ok(done) => Ok(format!("{done:?}")),
        Err(e) => Err(e.kind()),
    }
}

impl<'k> Suite<'k> {
    pub(super) fn new(kit: &'k Kit) -> Suite<'k> {
        Suite {
            kit,
            cases: Vec::new(),
        }
    }

    /// Adds a case.
    pub fn case(mut self, case: Case) -> Suite<'k> {
        self.cases.push(case);
        self
    }

    /// Runs every check.
    pub fn run(self) -> Report {
        let mut checker = Checker {
            kit: self.kit,
            report: Report::default(),
            more: Vec::new(),
        };
        let manifest = self.kit.manifest().clone();
        for endpoint in Endpoint::ALL {
            let served = manifest.endpoints.contains(&endpoint);
            let cases = self.cases.iter().filter(|c| c.call.endpoint() == endpoint);
            match (served, cases.count()) {
                (true, 0) => checker.violation(
                    Rule::EveryEndpointAnswers,
                    format!("{endpoint}: the manifest lists it, but the suite has no case for it"),
                ),
                (false, n) => {
                    if n > 0 {
                        checker.violation(
                            Rule::EveryEndpointAnswers,
                            format!(
                                "{endpoint}: a case for an endpoint the manifest does not list"
                            ),
                        );
                    }
                    checker.outside_manifest(endpoint);
                }
                (true, _) => {}
            }
        }
        let mut sequential = Vec::new();
        for case in &self.cases {
            let run = checker.answers(case);
            sequential.push(summary(&run));
            if let Some(not_found) = &case.not_found {
                checker.not_found(case, not_found);
            }
            // The case's own first reply, to the request the provider made.
            let first = run
                .requests
                .first()
                .and_then(|request| case.upstream.reply(request, 0));
            checker.echoes_no_key(case, first.as_ref());
            checker.odd_bodies(case, first.as_ref());
        }
        checker.threads(&self.cases, &sequential);
        checker.logs_hold_no_key();
        checker.finish()
    }
}

struct Checker<'k> {
    kit: &'k Kit,
    report: Report,
    /// For each violation, how many more variations broke the rule the
    /// same way (the same detail but for the variation named in it).
    more: Vec<usize>,
}

impl Checker<'_> {
    /// Records a broken rule once per cause: one already recorded but for
    /// the variation it names (`profile (the key echoed, HTTP 404): ...`)
    /// is counted, not listed again.
    fn violation(&mut self, rule: Rule, detail: String) {
        let cause = without_variation(&detail);
        let same = self
            .report
            .violations
            .iter()
            .position(|v| v.rule == rule && without_variation(&v.detail) == cause);
        match same {
            Some(i) if self.report.violations[i].detail == detail => {}
            Some(i) => self.more[i] += 1,
            None => {
                self.report.violations.push(Violation { rule, detail });
                self.more.push(0);
            }
        }
    }

    /// The report, each repeated cause saying how often it came back.
    fn finish(mut self) -> Report {
        for (violation, more) in self.report.violations.iter_mut().zip(self.more) {
            if more > 0 {
                violation
                    .detail
                    .push_str(&format!(" (and {more} more variation(s) alike)"));
            }
        }
        self.report
    }

    /// Runs `call` and checks the rules every run must keep.
    fn run(&mut self, call: &Call, upstream: &Upstream, what: &str) -> Run {
        let run = self.kit.run(call, upstream);
        self.report.runs += 1;
        let endpoint = call.endpoint();
        if run.capped {
            self.violation(
                Rule::StepCap,
                format!("{endpoint} ({what}): still fetching after {MAX_STEPS} steps"),
            );
        }
        if run.slowest_call > STEP_BUDGET {
            self.violation(
                Rule::StepCap,
                format!(
                    "{endpoint} ({what}): a call took {} ms; past {} ms the host moves \
                     the provider's calls off its request threads",
                    run.slowest_call.as_millis(),
                    STEP_BUDGET.as_millis()
                ),
            );
        }
        if let Err(e) = &run.outcome {
            if e.message().contains(self.kit.api_key()) {
                self.violation(
                    Rule::NoKeyInErrors,
                    format!(
                        "{endpoint} ({what}): a `{}` error message holds the key",
                        e.kind()
                    ),
                );
            }
            match e.kind() {
                ErrorKind::Panicked => self.violation(
                    Rule::NoPanic,
                    format!("{endpoint} ({what}): {}", e.message().replace(self.kit.api_key(), "<key>")),
                ),
                ErrorKind::NotFound if !endpoint.names_a_resource() => self.violation(
                    Rule::NotFoundOnlyForResources,
                    format!("{endpoint} ({what}): \"not found\" from an endpoint that names no resource"),
                ),
                ErrorKind::InvalidInput | ErrorKind::Unsupported if !run.requests.is_empty() => {
                    self.violation(
                        Rule::RefusalsBeforeRequests,
                        format!(
                            "{endpoint} ({what}): `{}` after {} request(s); the host counts it as an upstream failure",
                            e.kind(),
                            run.requests.len()
                        ),
                    )
                }
                ErrorKind::InvalidInput => {
                    let m = e.message();
                    if m.chars().count() > MAX_CALLER_MESSAGE || m.chars().any(char::is_control) {
                        self.violation(
                            Rule::CallerMessageFits,
                            format!(
                                "{endpoint} ({what}): an `invalid_input` message of {} characters or with control characters; callers see {MAX_CALLER_MESSAGE} on one line",
                                m.chars().count()
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
        run
    }

    fn outside_manifest(&mut self, endpoint: Endpoint) {
        let run = self.run(&sample(endpoint), &Upstream::none(), "outside the manifest");
        let refused = run.requests.is_empty() && run.kind() == Some(ErrorKind::Unsupported);
        if !refused {
            let how = match (&run.outcome, run.requests.len()) {
                (Ok(_), _) => "answered".to_owned(),
                (Err(e), 0) => format!("failed `{}` instead of `unsupported`", e.kind()),
                (Err(_), n) => format!("made {n} request(s)"),
            };
            self.violation(
                Rule::OutsideManifestRefused,
                format!("{endpoint}: not in the manifest, yet the call {how}"),
            );
        }
    }

    fn answers(&mut self, case: &Case) -> Run {
        let endpoint = case.call.endpoint();
        let run = self.run(&case.call, &case.upstream, "the case");
        match &run.outcome {
            Err(e) => self.violation(
                Rule::EveryEndpointAnswers,
                format!(
                    "{endpoint}: the case failed `{}`: {}",
                    e.kind(),
                    e.message().replace(self.kit.api_key(), "<key>")
                ),
            ),
            Ok(done) => {
                if let Some(cursor) = &done.next_cursor {
                    let next = case.call.clone().with_cursor(Some(cursor.clone()));
                    let upstream = case.next_page.as_ref().unwrap_or(&case.upstream);
                    let page = self.run(&next, upstream, "the next page");
                    // The very requests (URLs and headers) and the very
                    // page: nothing of the cursor reached the upstream. (A
                    // provider paging over one upstream answer makes the
                    // same requests for another page.)
                    let same_page = matches!(
                        (&page.outcome, &run.outcome),
                        (Ok(next), Ok(first)) if next.output == first.output
                    );
                    if same_page && page.requests == run.requests {
                        self.violation(
                            Rule::CursorsRoundTrip,
                            format!(
                                "{endpoint}: its own next cursor, given back, made the very \
                                 requests of the first page: the cursor never reaches the upstream \
                                 (callers would get the first page again, and the host ends the listing)"
                            ),
                        );
                    }
                    if let Err(e) = &page.outcome {
                        self.violation(
                            Rule::CursorsRoundTrip,
                            format!(
                                "{endpoint}: its own next cursor, given back, failed `{}`: {}",
                                e.kind(),
                                e.message().replace(self.kit.api_key(), "<key>")
                            ),
                        );
                    }
                }
            }
        }
        run
    }

    fn not_found(&mut self, case: &Case, upstream: &Upstream) {
        let endpoint = case.call.endpoint();
        let run = self.run(&case.call, upstream, "the \"not found\" replies");
        if endpoint.names_a_resource() && run.kind() != Some(ErrorKind::NotFound) {
            let got = match &run.outcome {
                Ok(_) => "an answer".to_owned(),
                Err(e) => format!("`{}`", e.kind()),
            };
            self.violation(
                Rule::NotFoundOnlyForResources,
                format!(
                    "{endpoint}: the upstream's \"no such\" replies gave {got}, not `not_found`"
                ),
            );
        }
    }

    /// The upstream echoes the key back in every shape it might: in the
    /// fields upstreams report errors in, as the whole body, in a header,
    /// and in every string of the case's own first reply (so in whatever
    /// field this provider reads).
    fn echoes_no_key(&mut self, case: &Case, first: Option<&Reply>) {
        let key = self.kit.api_key().to_owned();
        let json = format!(
            r#"{{"error":"invalid key {key}","message":"{key}","code":"{key}","msg":"{key}","status_msg":"{key}","err":"{key}","error_message":"{key}","error_description":"{key}","detail":"{key}","reason":"{key}","description":"{key}","data":null}}"#
        );
        let mut bodies = vec![json, key.clone()];
        if let Some(Ok(mut own)) = first.map(|r| serde_json::from_slice(&r.body)) {
            every_string_holds(&mut own, &format!("echo {key} echo"));
            bodies.push(own.to_string());
        }
        for status in [200, 400, 401, 403, 404, 429, 500] {
            for body in bodies.iter().cloned() {
                let reply = Reply::status(status, body).header("X-Echo", key.as_str());
                self.run(
                    &case.call,
                    &Upstream::always(reply),
                    &format!("the key echoed, HTTP {status}"),
                );
            }
        }
    }

    /// Bodies an upstream in trouble sends: none may panic the provider.
    fn odd_bodies(&mut self, case: &Case, first: Option<&Reply>) {
        let mut bodies: Vec<Vec<u8>> =
            ["", "{}", "[]", "null", "0", "\"\"", "<html>", "{\"data\":"]
                .iter()
                .map(|b| b.as_bytes().to_vec())
                .collect();
        // The case's own first reply, cut short and with its numbers huge.
        if let Some(first) = first {
            bodies.push(first.body[..first.body.len() / 2].to_vec());
            let text = String::from_utf8_lossy(&first.body);
            bodies.push(text.replace(':', ":99999999999999999999999").into_bytes());
        }
        for body in bodies {
            self.run(
                &case.call,
                &Upstream::always(Reply::ok(body)),
                "an odd body",
            );
        }
        for status in [301, 404, 410, 429, 502, 503] {
            self.run(
                &case.call,
                &Upstream::always(Reply::status(status, "").header("Retry-After", "x")),
                &format!("HTTP {status}"),
            );
        }
    }

    fn threads(&mut self, cases: &[Case], sequential: &[Result<String, ErrorKind>]) {
        let kit = self.kit;
        let concurrent: Vec<Result<String, ErrorKind>> = std::thread::scope(|scope| {
            let handles: Vec<_> = cases
                .iter()
                .flat_map(|case| std::iter::repeat_n(case, 3))
                .map(|case| scope.spawn(move || summary(&kit.run(&case.call, &case.upstream))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(ErrorKind::Panicked)))
                .collect()
        });
        self.report.runs += concurrent.len();
        for (i, got) in concurrent.iter().enumerate() {
            let (case, want) = (&cases[i / 3], &sequential[i / 3]);
            if got != want {
                self.violation(
                    Rule::Threads,
                    format!(
                        "{}: run on several threads at once, the case answered otherwise than alone",
                        case.call.endpoint()
                    ),
                );
            }
        }
    }

    fn logs_hold_no_key(&mut self) {
        let key = self.kit.api_key();
        if self.kit.logs().iter().any(|line| line.contains(key)) {
            self.violation(
                Rule::NoKeyInErrors,
                "a log line the provider sent holds the key".into(),
            );
        }
    }
}

/// `detail` without the variation it names: the first parenthesised part
/// after the endpoint (`profile (the key echoed, HTTP 404): x` is
/// `profile: x`).
fn without_variation(detail: &str) -> String {
    match (detail.find(" ("), detail.find("): ")) {
        (Some(open), Some(close)) if open < close => {
            format!("{}{}", &detail[..open], &detail[close + 1..])
        }
        _ => detail.to_owned(),
    }
}

/// `value` with every string in it (keys of objects aside) set to `text`.
fn every_string_holds(value: &mut serde_json::Value, text: &str) {
    match value {
        serde_json::Value::String(s) => *s = text.to_owned(),
        serde_json::Value::Array(items) => {
            for item in items {
                every_string_holds(item, text);
            }
        }
        serde_json::Value::Object(fields) => {
            for field in fields.values_mut() {
                every_string_holds(field, text);
            }
        }
        _ => {}
    }
}
