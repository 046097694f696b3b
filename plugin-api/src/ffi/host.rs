//! The host side of the boundary: loading a library and checking its
//! interface, and safe handles to the providers and attempts inside it.

use std::borrow::Cow;
use std::cell::Cell;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{RErr, ROk, ROption, RSlice, RString, RVec, Tuple2};

use super::secret::KeyFinder;
use super::{FfiAttemptBox, FfiProviderBox, FfiResponse, FfiStep, HostServices, PluginModuleRef};
use crate::canonical;
use crate::{
    Call, Done, ErrorKind, Manifest, Next, Output, ProviderConfig, ProviderError, UpstreamRequest,
    UpstreamResponse,
};

/// Why a plugin library could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// `abi_stable` refused it: not loadable, no root module, or built
    /// against an incompatible plugin-api (version or layout).
    Library(LibraryError),
    /// Its manifest is unreadable.
    Manifest(String),
    /// An ELF file cut short, which the dynamic loader would map and crash
    /// on ([`elf`](super::elf)).
    Incomplete(super::elf::Incomplete),
    /// It cannot be opened to be checked.
    Unreadable(std::io::Error),
    /// Built to abort on a panic: its first panic would end the host.
    AbortsOnPanic,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Library(e) => describe(e, f),
            LoadError::Manifest(why) => write!(f, "unreadable manifest: {why}"),
            LoadError::Incomplete(why) => write!(
                f,
                "an incomplete library file ({why}): one still being written, or cut short; \
                 replace libraries by renaming a finished file into place"
            ),
            LoadError::Unreadable(e) => write!(f, "cannot be loaded: {e}"),
            LoadError::AbortsOnPanic => f.write_str(
                "built with panic = \"abort\": its first panic would end the whole server \
                 instead of failing one attempt; build it with panic = \"unwind\" \
                 (the [profile.dev] and [profile.release] sections of the workspace's \
                 root Cargo.toml)",
            ),
        }
    }
}

/// abi_stable's reports span many lines (a layout mismatch prints both
/// layouts); say in one line what the operator has to do about it.
fn describe(error: &LibraryError, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    match error {
        LibraryError::OpenError { err, .. } => write!(f, "cannot be loaded: {err}"),
        LibraryError::GetSymbolError { .. } => {
            f.write_str("exports no plugin root module (not built with `export_provider!`)")
        }
        LibraryError::ParseVersionError(_) => f.write_str("declares an unreadable interface version"),
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => write!(
            f,
            "built against plugin-api {actual_version}, incompatible with this host's \
             {expected_version}; rebuild it against this host's plugin-api"
        ),
        LibraryError::AbiInstability(_) | LibraryError::InvalidCAbi { .. } => f.write_str(
            "built against an incompatible plugin-api: its interface layout differs from this \
             host's (abi_stable layout check); rebuild it against this host's plugin-api",
        ),
        LibraryError::InvalidAbiHeader(_) => {
            f.write_str("built with an incompatible abi_stable version; rebuild it against this host's plugin-api")
        }
        LibraryError::RootModule { err, .. } => {
            let text = err.to_string();
            write!(f, "its root module failed to start: {}", first_line(&text))
        }
        LibraryError::Many(errors) => match errors.first() {
            Some(first) => describe(first, f),
            None => f.write_str("unusable"),
        },
    }
}

fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("unknown library error")
}

impl std::error::Error for LoadError {}

/// A loaded plugin library. Libraries are never unloaded: their code may
/// still be running for requests started before a reload.
#[derive(Clone)]
pub struct Library {
    module: PluginModuleRef,
    manifest: Manifest,
    /// The plugin-api version the library was built against.
    plugin_api: String,
}

/// What a manifest says of the library's build, beside the [`Manifest`]
/// (see `manifest_json` on the plugin side).
#[derive(serde::Deserialize)]
struct Build {
    panic_strategy: Option<String>,
    manifest_panicked: Option<String>,
}

impl Library {
    /// Loads the library at `path` and checks its interface.
    ///
    /// Each path is loaded once per process by the dynamic loader: load
    /// distinct files (private copies) for distinct libraries.
    pub fn load(path: &std::path::Path) -> Result<Library, LoadError> {
        // A bare file name would send the loader searching its library
        // path instead of opening the file named.
        let path = match path.parent() {
            Some(parent) if parent.as_os_str().is_empty() => &std::path::Path::new(".").join(path),
            _ => path,
        };
        let mut file = std::fs::File::open(path).map_err(LoadError::Unreadable)?;
        let len = file.metadata().map_err(LoadError::Unreadable)?.len();
        super::elf::check(&mut file, len).map_err(LoadError::Incomplete)?;
        let header = lib_header_from_path(path).map_err(LoadError::Library)?;
        let plugin_api = header.version_strings().version.to_string();
        let module = header
            .init_root_module::<PluginModuleRef>()
            .map_err(LoadError::Library)?;
        Library::from_module(module, plugin_api)
    }

    /// A root module already in this process (the test kit's way in: the
    /// same adapters and checks as a loaded library, without a file).
    pub(crate) fn from_module(
        module: PluginModuleRef,
        plugin_api: String,
    ) -> Result<Library, LoadError> {
        let json = (module.manifest())();
        let build: Build =
            serde_json::from_str(json.as_str()).map_err(|e| LoadError::Manifest(e.to_string()))?;
        if let Some(why) = build.manifest_panicked {
            return Err(LoadError::Manifest(format!("`manifest()` failed: {why}")));
        }
        // Absent from libraries built against plugin-api before 1.4.0.
        if build.panic_strategy.is_some_and(|s| s != "unwind") {
            return Err(LoadError::AbortsOnPanic);
        }
        let manifest: Manifest =
            serde_json::from_str(json.as_str()).map_err(|e| LoadError::Manifest(e.to_string()))?;
        Ok(Library {
            module,
            manifest,
            plugin_api,
        })
    }

    /// Who the plugin says it is and what it serves.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The plugin-api version the library was built against (`1.6.0`).
    pub fn plugin_api_version(&self) -> &str {
        &self.plugin_api
    }

    /// Sets up one provider. The error is the plugin's reason, for the operator.
    pub fn instantiate(
        &self,
        config: &ProviderConfig,
        host: HostServices,
    ) -> Result<ProviderHandle, String> {
        let key = Arc::new(KeyFinder::new(&config.api_key));
        let config = serde_json::to_string(config).map_err(|e| e.to_string())?;
        match (self.module.instantiate())(config.as_str().into(), host) {
            ROk(inner) => Ok(ProviderHandle { inner, key }),
            RErr(reason) => Err(copied(&reason)),
        }
    }
}

/// A provider instance, shared by every request.
pub struct ProviderHandle {
    inner: FfiProviderBox,
    /// Its upstream key, which no answer may hold.
    key: Arc<KeyFinder>,
}

impl ProviderHandle {
    /// Starts an attempt at `call`.
    pub fn begin(&self, call: &Call) -> AttemptHandle {
        let json = serde_json::to_string(call).expect("a Call always serializes");
        AttemptHandle {
            inner: self.inner.begin(json.as_str().into()),
            endpoint: call.endpoint(),
            most_items: call.most_items(),
            cursor: call.cursor().map(str::to_owned),
            key: Arc::clone(&self.key),
        }
    }
}

/// The longest upstream cursor a provider may hand out: the host seals it
/// into the token callers carry in a URL.
pub const MAX_CURSOR_LEN: usize = 1024;

/// Steps the host allows one attempt (a comment page of 200 takes 4, a
/// first page of posts 2): an attempt still fetching at the last one fails
/// as a bad response, so a plugin that loops is cut off.
pub const MAX_STEPS: usize = 16;

/// The longest one call into a plugin may take, the host's calls being
/// `begin` with the first `step` (made together), and each later `step`: a
/// provider whose call runs longer has its calls moved off the host's
/// request threads (quarantined) until it is set up anew. Generous: a
/// debug build parsing a large body can take a few hundred ms; a loop
/// never ends. Since 1.4.
pub const STEP_BUDGET: Duration = Duration::from_secs(1);

/// The most characters of an [`ErrorKind::InvalidInput`] message a caller
/// is shown; see [`caller_message`].
pub const MAX_CALLER_MESSAGE: usize = 200;

/// A plugin's "invalid input" message as a caller sees it: control
/// characters dropped, cut at [`MAX_CALLER_MESSAGE`] characters.
pub fn caller_message(message: &str) -> String {
    message
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_CALLER_MESSAGE)
        .collect()
}

/// A host-owned copy of a string the plugin allocated. `RString` into
/// `String` would adopt the plugin's buffer when both sides were built by
/// the same compiler, and the host would then free it with its own global
/// allocator: undefined behaviour for a plugin (or host) with another one.
/// The plugin's buffer is freed through its own vtable when dropped.
fn copied(plugin_owned: &RString) -> String {
    plugin_owned.as_str().to_owned()
}

/// One attempt in progress; see [`Attempt`](crate::Attempt).
pub struct AttemptHandle {
    inner: FfiAttemptBox,
    endpoint: crate::Endpoint,
    /// The call's [`Call::most_items`].
    most_items: Option<usize>,
    /// The upstream cursor the call continues from.
    cursor: Option<String>,
    /// The provider's upstream key.
    key: Arc<KeyFinder>,
}

impl AttemptHandle {
    /// Feeds the last response (none at first) and returns what the plugin
    /// wants next. An answer of another endpoint's shape, one that does not
    /// decode strictly, one that breaks [`Output::check`], or one that holds
    /// the provider's upstream key (echoed by the upstream into a field the
    /// plugin passed on: every caller would get it) is a bad response. A
    /// listing ends at a page with nothing on it, and at a next cursor
    /// equal to the one this call continued from: an upstream that says
    /// "more" there would hand the caller empty or repeated pages for ever,
    /// each one paid for.
    pub fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        match self.call_step(response) {
            FfiStep::Done {
                output,
                next_cursor,
            } => {
                let (output, _) = self.checked_output(output.as_str())?;
                Ok(Next::Done(Done {
                    next_cursor: self.next_cursor(next_cursor, &output)?,
                    output,
                }))
            }
            other => self.fetch_or_fail(other).map(Next::Fetch),
        }
    }

    /// [`step`](Self::step) as the host takes it: an answer comes with its
    /// data as JSON, ready to be passed on. The plugin's own text of it is
    /// taken as it is when it is exactly what serde_json writes for the
    /// value it decodes to (as plugin-api always writes it); otherwise the
    /// decoded value is written anew.
    pub fn advance(
        &mut self,
        response: Option<UpstreamResponse<'_>>,
    ) -> Result<Advance, ProviderError> {
        match self.call_step(response) {
            FfiStep::Done {
                output,
                next_cursor,
            } => {
                let (output, data) = self.checked_output(output.as_str())?;
                Ok(Advance::Done(Answer {
                    next_cursor: self.next_cursor(next_cursor, &output)?,
                    data: data.into_owned(),
                }))
            }
            other => self.fetch_or_fail(other).map(Advance::Fetch),
        }
    }

    fn call_step(&mut self, response: Option<UpstreamResponse<'_>>) -> FfiStep {
        match response {
            None => self.inner.step(None.into()),
            Some(r) => lending_headers(r, |headers| {
                self.inner.step(
                    Some(FfiResponse {
                        status: r.status,
                        headers,
                        body: r.body.into(),
                    })
                    .into(),
                )
            }),
        }
    }

    /// A plugin's answer, decoded and checked, with its data as callers
    /// get it: the plugin's own text of it when `text` is in the one form
    /// serde_json writes (see [`canonical`](crate::canonical)), otherwise
    /// written anew.
    fn checked_output<'t>(&self, text: &'t str) -> Result<(Output, Cow<'t, str>), ProviderError> {
        let (output, written) = read_output(text).map_err(|e| {
            ProviderError::bad_response(format!("plugin output does not fit the schema: {e}"))
        })?;
        if output.endpoint() != self.endpoint {
            return Err(ProviderError::bad_response(format!(
                "plugin answered {} to a {} call",
                output.endpoint(),
                self.endpoint
            )));
        }
        output.check(self.most_items).map_err(|problem| {
            ProviderError::bad_response(format!("plugin answer has {problem}"))
        })?;
        let data = match written {
            Some(data) => Cow::Borrowed(&text[data]),
            None => Cow::Owned(output.data_json()),
        };
        // Looked for in the data callers get, not in the plugin's own text,
        // whose JSON escapes could hide it.
        if self.key.is_in(&data) {
            return Err(ProviderError::bad_response(
                "the answer holds the upstream key (echoed by the upstream?)",
            ));
        }
        Ok((output, data))
    }

    /// The plugin's next cursor for the page `output`, unless following it
    /// could not move on (see [`step`](Self::step)).
    fn next_cursor(
        &self,
        next_cursor: ROption<RString>,
        output: &Output,
    ) -> Result<Option<String>, ProviderError> {
        let next_cursor: Option<String> = next_cursor
            .as_ref()
            .into_option()
            .filter(|_| !output.is_empty_page())
            .map(copied)
            .filter(|next| Some(next) != self.cursor.as_ref());
        if next_cursor
            .as_ref()
            .is_some_and(|c| c.len() > MAX_CURSOR_LEN)
        {
            return Err(ProviderError::bad_response(format!(
                "plugin gave a cursor longer than {MAX_CURSOR_LEN} bytes"
            )));
        }
        Ok(next_cursor)
    }

    /// A step that is not an answer: the request to make, or the failure.
    fn fetch_or_fail(&self, step: FfiStep) -> Result<UpstreamRequest, ProviderError> {
        match step {
            FfiStep::Fetch {
                method,
                url,
                headers,
                body: _,
            } => Ok(UpstreamRequest::from_parts(
                copied(&method),
                copied(&url),
                headers
                    .iter()
                    .map(|t| (copied(&t.0), copied(&t.1)))
                    .collect(),
            )),
            FfiStep::Fail {
                kind,
                message,
                retry_after_ms,
            } => {
                let error = ProviderError::new(ErrorKind::from_code(kind), copied(&message));
                Err(match retry_after_ms.into_option() {
                    Some(ms) => error.retry_after(Duration::from_millis(ms)),
                    None => error,
                })
            }
            FfiStep::Done { .. } => unreachable!("answers are taken before"),
        }
    }
}

/// A plugin's answer decoded strictly; with where its data lies in `text`
/// when `text` is in the one form serde_json writes.
fn read_output(text: &str) -> Result<(Output, Option<Range<usize>>), serde_json::Error> {
    match canonical::from_str::<Output>(text) {
        Ok(output) => {
            debug_assert_eq!(serde_json::to_string(&output).ok().as_deref(), Some(text));
            // `{"variant":DATA}`: the variant's name holds no `:`.
            let start = text.find(':').map_or(0, |colon| colon + 1);
            Ok((output, Some(start..text.len() - 1)))
        }
        Err(_) => serde_json::from_str::<Output>(text).map(|output| (output, None)),
    }
}

/// What the host does after [`AttemptHandle::advance`].
#[derive(Debug)]
pub enum Advance {
    /// Perform this request, and advance with its response.
    Fetch(UpstreamRequest),
    /// The answer.
    Done(Answer),
}

/// An answer as the host passes it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The answer's `data`: the output's value as JSON, without its
    /// variant ([`Output::data_json`]).
    pub data: String,
    /// As [`Done::next_cursor`].
    pub next_cursor: Option<String>,
}

thread_local! {
    /// The header pairs this thread lends plugins, kept from step to step so
    /// that their strings' room is reused: made anew, they were two
    /// allocations a header a step, for headers most steps never read.
    static LENT_HEADERS: Cell<RVec<Tuple2<RString, RString>>> =
        const { Cell::new(RVec::new()) };
}

/// Above this much room, the kept pairs are dropped after the step: one
/// answer with huge headers should not pin its room to a thread for ever.
const MOST_KEPT_HEADER_ROOM: usize = 16 * 1024;

/// Runs `step` with `response`'s headers as the pairs the interface lends a
/// plugin, written into this thread's kept pairs.
fn lending_headers<T>(
    response: UpstreamResponse<'_>,
    step: impl FnOnce(RSlice<'_, Tuple2<RString, RString>>) -> T,
) -> T {
    // Taken out while the step runs: were a step ever to start another on
    // its thread, that one would find none kept and make its own.
    let mut pairs = LENT_HEADERS.take();
    let mut count = 0;
    for (name, value) in response.headers.iter() {
        match pairs.get_mut(count) {
            Some(Tuple2(kept_name, kept_value)) => {
                kept_name.clear();
                kept_name.push_str(name);
                kept_value.clear();
                kept_value.push_str(value);
            }
            None => pairs.push(Tuple2(name.into(), value.into())),
        }
        count += 1;
    }
    let output = step(RSlice::from_slice(&pairs[..count]));
    let room: usize = pairs
        .iter()
        .map(|Tuple2(name, value)| name.capacity() + value.capacity())
        .sum();
    if room <= MOST_KEPT_HEADER_ROOM {
        LENT_HEADERS.set(pairs);
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Attempt, Call, Endpoint, Profile, Provider};
    use abi_stable::prefix_type::PrefixTypeTrait;
    use abi_stable::std_types::{RResult, RStr};

    /// A provider whose `manifest()` panics unless it is `NAMED`.
    struct Toy<const NAMED: bool>;

    impl<const NAMED: bool> Provider for Toy<NAMED> {
        fn manifest() -> Manifest {
            assert!(NAMED, "no name yet");
            Manifest {
                name: "toy".into(),
                version: "1.0.0".into(),
                platform: "toy".into(),
                endpoints: vec![Endpoint::Profile],
            }
        }
        fn new(_: ProviderConfig) -> Result<Self, String> {
            Ok(Toy)
        }
        fn begin(&self, _: Call) -> Box<dyn Attempt> {
            crate::attempt::fail(ProviderError::bad_response("unused"))
        }
    }

    extern "C" fn built_to_abort() -> RString {
        let manifest = r#"{"name":"a","version":"1.0.0","platform":"a","endpoints":["profile"],
            "panic_strategy":"abort"}"#;
        manifest.into()
    }

    /// What a library built against plugin-api before 1.4.0 says.
    extern "C" fn built_before_the_strategy_was_written() -> RString {
        r#"{"name":"a","version":"1.0.0","platform":"a","endpoints":["profile"]}"#.into()
    }

    extern "C" fn no_provider(_: RStr<'_>, _: HostServices) -> RResult<FfiProviderBox, RString> {
        RErr("unused".into())
    }

    fn library(manifest: extern "C" fn() -> RString) -> Result<Library, LoadError> {
        let module = super::super::PluginModule {
            manifest,
            instantiate: no_provider,
        }
        .leak_into_prefix();
        Library::from_module(module, "1.3.0".into())
    }

    #[test]
    fn a_library_built_to_abort_on_a_panic_is_refused() {
        let refused = library(built_to_abort).err().expect("refused");
        assert!(matches!(refused, LoadError::AbortsOnPanic));
        assert!(
            refused.to_string().contains(r#"panic = "unwind""#),
            "{refused}"
        );
        let older = library(built_before_the_strategy_was_written).expect("loads");
        assert_eq!(older.manifest().endpoints, [Endpoint::Profile]);
        // This crate's tests unwind: the real adapter says so.
        let module = super::super::plugin::root_module::<Toy<true>>();
        assert_eq!(
            Library::from_module(module, "1.3.0".into())
                .unwrap()
                .manifest()
                .name,
            "toy"
        );
    }

    #[test]
    fn a_manifest_that_panics_is_refused_with_its_message() {
        let module = super::super::plugin::root_module::<Toy<false>>();
        let refused = Library::from_module(module, "1.3.0".into())
            .err()
            .expect("refused");
        let message = refused.to_string();
        assert!(
            message.contains("`manifest()` failed: plugin panicked: no name yet (at "),
            "{message}"
        );
    }

    /// A plugin that answers its text at once (written as it likes,
    /// whatever plugin-api writes), with a next cursor.
    struct Written(&'static str, Option<&'static str>);

    impl super::super::FfiAttempt for Written {
        fn step(&mut self, _: ROption<FfiResponse<'_>>) -> FfiStep {
            FfiStep::Done {
                output: self.0.into(),
                next_cursor: self.1.map(RString::from).into(),
            }
        }
    }

    #[test]
    fn a_listing_ends_at_an_empty_page_or_a_cursor_that_does_not_move() {
        let post = crate::schema::bare_post("1");
        let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
        let page = leak(serde_json::to_string(&Output::Posts(vec![post])).unwrap());
        let empty = leak(serde_json::to_string(&Output::Posts(vec![])).unwrap());
        for (text, next, expected) in [
            (page, "10", Some("10")),
            (page, "5", None),
            (empty, "10", None),
        ] {
            let mut attempt = AttemptHandle {
                inner: super::super::FfiAttempt_TO::from_value(
                    Written(text, Some(next)),
                    abi_stable::sabi_trait::TD_Opaque,
                ),
                endpoint: Endpoint::Posts,
                most_items: Some(10),
                cursor: Some("5".into()),
                key: Arc::new(KeyFinder::new("sk_live_abcdef")),
            };
            let Ok(Advance::Done(answer)) = attempt.advance(None) else {
                panic!("refused: {text}");
            };
            assert_eq!(answer.next_cursor.as_deref(), expected, "{text} {next}");
        }
    }

    /// Review: the key is looked for in the data callers get, so a JSON
    /// escape in the plugin's own text (rewritten, then plain) hides
    /// nothing.
    #[test]
    fn an_answer_holding_the_key_is_refused_however_the_plugin_wrote_it() {
        let attempt = |text: &'static str| AttemptHandle {
            inner: super::super::FfiAttempt_TO::from_value(
                Written(text, None),
                abi_stable::sabi_trait::TD_Opaque,
            ),
            endpoint: Endpoint::Profile,
            most_items: None,
            cursor: None,
            key: Arc::new(KeyFinder::new("sk_live_abcdef")),
        };
        let profile = |bio: &str| {
            format!(
                r#"{{"profile":{{"username":"luna","display_name":"L","followers":1,"verified":false,"id":null,"bio":"{bio}","following":null,"likes":null,"videos":null,"avatar_url":null}}}}"#
            )
        };
        let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
        for text in [
            leak(profile("sk_live_abcdef")),
            leak(profile("\\u0073k_live_abcdef")),
            leak(format!(" {}", profile("sk\\u005flive_abcdef"))),
        ] {
            for refused in [
                attempt(text).advance(None).err(),
                attempt(text).step(None).err(),
            ] {
                let error = refused.unwrap_or_else(|| panic!("passed: {text}"));
                assert!(
                    error.message().contains("holds the upstream key"),
                    "{error}"
                );
            }
        }
        assert!(matches!(
            attempt(leak(profile("no key here"))).advance(None),
            Ok(Advance::Done(_))
        ));
    }

    #[test]
    fn an_answer_in_serde_jsons_form_is_passed_on_as_written_and_any_other_rewritten() {
        let output = Output::Profile(Profile {
            username: "luna".into(),
            display_name: "Luna \"Bakes\" \u{1f370}\n".into(),
            followers: 5,
            verified: true,
            id: None,
            bio: Some(String::new()),
            following: None,
            likes: Some(0),
            videos: None,
            avatar_url: None,
        });
        let written = serde_json::to_string(&output).unwrap();
        let (read, data) = read_output(&written).unwrap();
        assert_eq!(read, output);
        assert_eq!(&written[data.unwrap()], output.data_json());

        // The same value in other forms: read, but written anew.
        let pretty = serde_json::to_string_pretty(&output).unwrap();
        let reordered = written
            .replacen(
                r#""username":"luna","display_name""#,
                r#""display_name""#,
                1,
            )
            .replacen(r#","followers""#, r#","username":"luna","followers""#, 1);
        let without_nulls = written.replace(r#","id":null"#, "");
        for text in [pretty, reordered, without_nulls] {
            assert_ne!(text, written);
            let (read, data) = read_output(&text).unwrap();
            assert_eq!(read, output, "{text}");
            assert!(data.is_none(), "{text}");
        }
        assert!(read_output(r#"{"profile":{"username":"luna"}}"#).is_err());
    }
}
