//! The binary interface between host and plugins, built on `abi_stable`.
//!
//! Plugin authors never touch this module: [`export_provider!`](crate::export_provider) wires a
//! [`Provider`] to it, and the host reaches plugins only through
//! [`Library`], [`ProviderHandle`] and [`AttemptHandle`].
//!
//! The control flow (steps, requests, errors) crosses as `StableAbi` types
//! whose layout `abi_stable` checks at load. The normalized data and the
//! call parameters cross as JSON written and read by this crate on both
//! sides, so the schema has one definition and a plugin cannot smuggle
//! another shape past the host's strict decoding.
//!
//! Every call into plugin code runs inside `catch_unwind`: a panic becomes an
//! [`ErrorKind::Panicked`] failure, never an abort of the host.

// abi_stable's derive and sabi_trait macros emit impls inside consts, which
// the `non_local_definitions` lint flags. They are sound; allow it here only.
#![allow(non_local_definitions)]

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use abi_stable::library::{
    lib_header_from_path, CheckTypeLayout, LibraryError, RootModule, RootModuleResult,
};
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{
    RBox, RErr, ROk, ROption, RResult, RSlice, RStr, RString, RVec, Tuple2,
};
use abi_stable::{declare_root_module_statics, package_version_strings, sabi_trait, StableAbi};

#[doc(hidden)]
pub use abi_stable::library::LibHeader;

use crate::attempt;
use crate::{
    Attempt, Call, Done, ErrorKind, Manifest, Next, Output, Provider, ProviderConfig,
    ProviderError, UpstreamRequest, UpstreamResponse,
};

/// The root module every plugin library exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// The provider's [`Manifest`] as JSON.
    pub manifest: extern "C" fn() -> RString,
    /// Sets up a provider from a [`ProviderConfig`] as JSON.
    #[sabi(last_prefix_field)]
    pub instantiate:
        extern "C" fn(config: RStr<'_>, host: HostServices) -> RResult<FfiProviderBox, RString>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "socialgate_provider";
    const NAME: &'static str = "socialgate provider";
    const VERSION_STRINGS: abi_stable::sabi_types::VersionStrings = package_version_strings!();
}

/// What the host offers a plugin.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct HostServices {
    /// Writes one log line: level (see [`crate::log::Level`]), target, message.
    pub log: extern "C" fn(level: u8, target: RStr<'_>, message: RStr<'_>),
}

/// A provider instance behind the boundary.
#[sabi_trait]
pub trait FfiProvider: Send + Sync {
    /// Starts an attempt for a [`Call`] given as JSON.
    #[sabi(last_prefix_field)]
    fn begin(&self, call: RStr<'_>) -> FfiAttemptBox;
}

/// An owned [`FfiProvider`] trait object.
pub type FfiProviderBox = FfiProvider_TO<'static, RBox<()>>;

/// One attempt behind the boundary.
#[sabi_trait]
pub trait FfiAttempt: Send {
    #[sabi(last_prefix_field)]
    fn step(&mut self, response: ROption<FfiResponse<'_>>) -> FfiStep;
}

/// An owned [`FfiAttempt`] trait object.
pub type FfiAttemptBox = FfiAttempt_TO<'static, RBox<()>>;

/// An upstream response lent to the plugin for one step.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiResponse<'a> {
    pub status: u16,
    pub headers: RSlice<'a, Tuple2<RString, RString>>,
    pub body: RSlice<'a, u8>,
}

/// What an attempt wants next.
#[repr(u8)]
#[derive(StableAbi)]
pub enum FfiStep {
    Fetch {
        method: RString,
        url: RString,
        headers: RVec<Tuple2<RString, RString>>,
        body: RVec<u8>,
    },
    Done {
        output: RString,
        next_cursor: ROption<RString>,
    },
    Fail {
        kind: u8,
        message: RString,
        retry_after_ms: ROption<u64>,
    },
}

impl From<ProviderError> for FfiStep {
    fn from(error: ProviderError) -> FfiStep {
        FfiStep::Fail {
            kind: error.kind().code(),
            message: error.message().into(),
            retry_after_ms: error
                .retry_after_hint()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .into(),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    format!("plugin panicked: {text}")
}

fn panicked(payload: Box<dyn Any + Send>) -> ProviderError {
    ProviderError::new(ErrorKind::Panicked, panic_message(&*payload))
}

// ---------------------------------------------------------------------------
// Plugin side: adapters from the safe traits to the ABI.

struct ProviderAdapter<P>(Option<P>);

/// A provider's own destructor runs here, in the plugin: keep its panic on
/// this side of the boundary.
impl<P> Drop for ProviderAdapter<P> {
    fn drop(&mut self) {
        let provider = self.0.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(provider)));
    }
}

impl<P: Provider> FfiProvider for ProviderAdapter<P> {
    fn begin(&self, call: RStr<'_>) -> FfiAttemptBox {
        let started = catch_unwind(AssertUnwindSafe(|| {
            match (serde_json::from_str::<Call>(call.as_str()), &self.0) {
                (Ok(call), Some(provider)) => provider.begin(call),
                (Ok(_), None) => attempt::fail(ProviderError::bad_response("provider is gone")),
                (Err(e), _) => attempt::fail(ProviderError::bad_response(format!(
                    "host sent an unreadable call: {e}"
                ))),
            }
        }));
        let inner = started.unwrap_or_else(|payload| attempt::fail(panicked(payload)));
        FfiAttempt_TO::from_value(AttemptAdapter { inner: Some(inner) }, TD_Opaque)
    }
}

struct AttemptAdapter {
    /// `None` once the attempt panicked: its state may be torn.
    inner: Option<Box<dyn Attempt>>,
}

/// An attempt's destructor is plugin code too.
impl Drop for AttemptAdapter {
    fn drop(&mut self) {
        let inner = self.inner.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(inner)));
    }
}

impl FfiAttempt for AttemptAdapter {
    fn step(&mut self, response: ROption<FfiResponse<'_>>) -> FfiStep {
        let Some(inner) = self.inner.as_mut() else {
            return ProviderError::new(ErrorKind::Panicked, "attempt already panicked").into();
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let response = response.into_option();
            let headers: Vec<(String, String)> = response
                .as_ref()
                .map(|r| {
                    r.headers
                        .iter()
                        .map(|t| (t.0.to_string(), t.1.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let response = response
                .as_ref()
                .map(|r| UpstreamResponse::new(r.status, &headers, r.body.as_slice()));
            inner.step(response)
        }));
        match outcome {
            Ok(Ok(Next::Fetch(request))) => FfiStep::Fetch {
                method: request.method.into(),
                url: request.url.into(),
                headers: request
                    .headers
                    .into_iter()
                    .map(|(n, v)| Tuple2(n.into(), v.into()))
                    .collect(),
                body: RVec::new(),
            },
            Ok(Ok(Next::Done(done))) => match serde_json::to_string(&done.output) {
                Ok(output) => FfiStep::Done {
                    output: output.into(),
                    next_cursor: done.next_cursor.map(RString::from).into(),
                },
                Err(e) => ProviderError::bad_response(format!("unwritable output: {e}")).into(),
            },
            Ok(Err(error)) => error.into(),
            Err(payload) => {
                self.inner = None;
                panicked(payload).into()
            }
        }
    }
}

extern "C" fn manifest_json<P: Provider>() -> RString {
    // An empty string is an unreadable manifest, which fails the load.
    catch_unwind(|| serde_json::to_string(&P::manifest()).unwrap_or_default())
        .unwrap_or_default()
        .into()
}

extern "C" fn instantiate<P: Provider>(
    config: RStr<'_>,
    host: HostServices,
) -> RResult<FfiProviderBox, RString> {
    crate::log::install(host);
    let created = catch_unwind(AssertUnwindSafe(|| {
        let config: ProviderConfig = serde_json::from_str(config.as_str())
            .map_err(|e| format!("unreadable provider config: {e}"))?;
        P::new(config)
    }));
    match created {
        Ok(Ok(provider)) => ROk(FfiProvider_TO::from_value(
            ProviderAdapter(Some(provider)),
            TD_Opaque,
        )),
        Ok(Err(reason)) => RErr(reason.into()),
        Err(payload) => RErr(format!("set-up failed: {}", panic_message(&*payload)).into()),
    }
}

#[doc(hidden)]
pub fn root_module<P: Provider>() -> PluginModuleRef {
    PluginModule {
        manifest: manifest_json::<P>,
        instantiate: instantiate::<P>,
    }
    .leak_into_prefix()
}

extern "C" fn construct_root_module<P: Provider>() -> RootModuleResult {
    abi_stable::library::__call_root_module_loader(root_module::<P>)
}

/// The header `abi_stable` looks for in a plugin library; see
/// [`export_provider!`].
#[doc(hidden)]
pub const fn lib_header<P: Provider>() -> LibHeader {
    // SAFETY: the constructor returns the root module of type
    // `PluginModuleRef`, the type the header is declared with.
    unsafe {
        LibHeader::from_constructor::<PluginModuleRef>(
            construct_root_module::<P>,
            CheckTypeLayout::Yes,
        )
    }
}

/// Exports a [`Provider`] as the plugin library's root module.
///
/// Use it once, in a crate built as `crate-type = ["cdylib"]`:
///
/// ```ignore
/// plugin_api::export_provider!(MyProvider);
/// ```
///
/// It emits the `#[no_mangle]` static that `abi_stable`'s
/// `#[export_root_module]` would, with paths through this crate, so a plugin
/// crate needs no dependency on `abi_stable` and writes no `unsafe`.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        /// The plugin's root module header, found by the host by this name.
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::ffi::LibHeader =
            $crate::ffi::lib_header::<$provider>();
    };
}

// ---------------------------------------------------------------------------
// Host side: safe handles over a loaded library.

/// Why a plugin library could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// `abi_stable` refused it: not loadable, no root module, or built
    /// against an incompatible plugin-api (version or layout).
    Library(LibraryError),
    /// Its manifest is unreadable.
    Manifest(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Library(e) => describe(e, f),
            LoadError::Manifest(why) => write!(f, "unreadable manifest: {why}"),
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
}

impl Library {
    /// Loads the library at `path` and checks its interface.
    ///
    /// Each path is loaded once per process by the dynamic loader: load
    /// distinct files (private copies) for distinct libraries.
    pub fn load(path: &std::path::Path) -> Result<Library, LoadError> {
        let header = lib_header_from_path(path).map_err(LoadError::Library)?;
        let module = header
            .init_root_module::<PluginModuleRef>()
            .map_err(LoadError::Library)?;
        let json = (module.manifest())();
        let manifest: Manifest =
            serde_json::from_str(json.as_str()).map_err(|e| LoadError::Manifest(e.to_string()))?;
        Ok(Library { module, manifest })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Sets up one provider. The error is the plugin's reason, for the operator.
    pub fn instantiate(
        &self,
        config: &ProviderConfig,
        host: HostServices,
    ) -> Result<ProviderHandle, String> {
        let config = serde_json::to_string(config).map_err(|e| e.to_string())?;
        match (self.module.instantiate())(config.as_str().into(), host) {
            ROk(inner) => Ok(ProviderHandle { inner }),
            RErr(reason) => Err(reason.into()),
        }
    }
}

/// A provider instance, shared by every request.
pub struct ProviderHandle {
    inner: FfiProviderBox,
}

impl ProviderHandle {
    /// Starts an attempt at `call`.
    pub fn begin(&self, call: &Call) -> AttemptHandle {
        let json = serde_json::to_string(call).expect("a Call always serializes");
        AttemptHandle {
            inner: self.inner.begin(json.as_str().into()),
            endpoint: call.endpoint(),
        }
    }
}

/// The longest upstream cursor a provider may hand out: the host seals it
/// into the token callers carry in a URL.
pub const MAX_CURSOR_LEN: usize = 1024;

/// One attempt in progress; see [`Attempt`].
pub struct AttemptHandle {
    inner: FfiAttemptBox,
    endpoint: crate::Endpoint,
}

impl AttemptHandle {
    /// Feeds the last response (none at first) and returns what the plugin
    /// wants next. An answer of another endpoint's shape, or one that does
    /// not decode strictly, is a bad response.
    pub fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        let headers: RVec<Tuple2<RString, RString>> = response
            .map(|r| {
                r.headers
                    .iter()
                    .map(|(n, v)| Tuple2(n.as_str().into(), v.as_str().into()))
                    .collect()
            })
            .unwrap_or_default();
        let response = response.map(|r| FfiResponse {
            status: r.status,
            headers: headers.as_rslice(),
            body: r.body.into(),
        });
        match self.inner.step(response.into()) {
            FfiStep::Fetch {
                method,
                url,
                headers,
                body: _,
            } => Ok(Next::Fetch(UpstreamRequest::from_parts(
                method.into(),
                url.into(),
                headers
                    .into_iter()
                    .map(|t| (t.0.into(), t.1.into()))
                    .collect(),
            ))),
            FfiStep::Done {
                output,
                next_cursor,
            } => {
                let output: Output = serde_json::from_str(output.as_str()).map_err(|e| {
                    ProviderError::bad_response(format!(
                        "plugin output does not fit the schema: {e}"
                    ))
                })?;
                if output.endpoint() != self.endpoint {
                    return Err(ProviderError::bad_response(format!(
                        "plugin answered {} to a {} call",
                        output.endpoint(),
                        self.endpoint
                    )));
                }
                let next_cursor: Option<String> = next_cursor.into_option().map(Into::into);
                if next_cursor
                    .as_ref()
                    .is_some_and(|c| c.len() > MAX_CURSOR_LEN)
                {
                    return Err(ProviderError::bad_response(format!(
                        "plugin gave a cursor longer than {MAX_CURSOR_LEN} bytes"
                    )));
                }
                Ok(Next::Done(Done {
                    output,
                    next_cursor,
                }))
            }
            FfiStep::Fail {
                kind,
                message,
                retry_after_ms,
            } => {
                let error = ProviderError::new(ErrorKind::from_code(kind), message);
                Err(match retry_after_ms.into_option() {
                    Some(ms) => error.retry_after(Duration::from_millis(ms)),
                    None => error,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn export_macro_uses_abi_stables_symbol_name() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
