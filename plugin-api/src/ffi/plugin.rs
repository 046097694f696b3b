//! The plugin side of the boundary: adapters from the safe [`Provider`] and
//! [`Attempt`] traits to the ABI, with every call into the author's code
//! inside `catch_unwind`, and what [`export_provider!`](crate::export_provider)
//! expands to.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use abi_stable::library::{CheckTypeLayout, RootModuleResult};
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, ROption, RResult, RStr, RString, RVec, Tuple2};

#[doc(hidden)]
pub use abi_stable::library::LibHeader;

use super::{
    FfiAttempt, FfiAttemptBox, FfiAttempt_TO, FfiProvider, FfiProviderBox, FfiProvider_TO,
    FfiResponse, FfiStep, HostServices, PluginModule, PluginModuleRef,
};
use crate::attempt;
use crate::canonical;
use crate::{
    Attempt, Call, ErrorKind, Next, Output, Provider, ProviderConfig, ProviderError,
    UpstreamResponse,
};

thread_local! {
    /// Whether the author's code is running under [`caught`] on this thread.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// Where the last panic caught on this thread happened.
    static PANICKED_AT: Cell<Option<String>> = const { Cell::new(None) };
}

/// Runs the author's `f`, catching a panic. Such a panic becomes an error
/// the host logs (with where it happened), so the panic hook keeps quiet
/// about it: std's own would write its message, and a backtrace, to the
/// host's standard error, past the host's log (one JSON object a line).
/// A panic anywhere else goes to the hook that was there before.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, Box<dyn Any + Send>> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.get() {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                PANICKED_AT.set(at);
            } else {
                before(info);
            }
        }));
    });
    let was = CATCHING.replace(true);
    let outcome = catch_unwind(AssertUnwindSafe(f));
    CATCHING.set(was);
    outcome
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    match PANICKED_AT.take() {
        Some(at) => format!("plugin panicked: {text} (at {at})"),
        None => format!("plugin panicked: {text}"),
    }
}

fn panicked(payload: Box<dyn Any + Send>) -> ProviderError {
    ProviderError::new(ErrorKind::Panicked, panic_message(&*payload))
}

struct ProviderAdapter<P>(Option<P>);

/// A provider's own destructor runs here, in the plugin: keep its panic on
/// this side of the boundary.
impl<P> Drop for ProviderAdapter<P> {
    fn drop(&mut self) {
        let provider = self.0.take();
        let _ = caught(move || drop(provider));
    }
}

impl<P: Provider> FfiProvider for ProviderAdapter<P> {
    fn begin(&self, call: RStr<'_>) -> FfiAttemptBox {
        let started = caught(
            || match (serde_json::from_str::<Call>(call.as_str()), &self.0) {
                (Ok(call), Some(provider)) => provider.begin(call),
                (Ok(_), None) => attempt::fail(ProviderError::bad_response("provider is gone")),
                (Err(e), _) => attempt::fail(ProviderError::bad_response(format!(
                    "host sent an unreadable call: {e}"
                ))),
            },
        );
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
        let _ = caught(move || drop(inner));
    }
}

impl FfiAttempt for AttemptAdapter {
    fn step(&mut self, response: ROption<FfiResponse<'_>>) -> FfiStep {
        let Some(inner) = self.inner.as_mut() else {
            return ProviderError::new(ErrorKind::Panicked, "attempt already panicked").into();
        };
        let response = response.into_option();
        // The answer is usually smaller than what the upstream sent: writing
        // it into that much room (within reason) spares most reallocations.
        let room = response.as_ref().map_or(0, |r| r.body.len().min(MAX_ROOM));
        let outcome = caught(|| {
            let response = response
                .as_ref()
                .map(|r| UpstreamResponse::lent(r.status, &r.headers, r.body.as_slice()));
            inner.step(response)
        });
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
            Ok(Ok(Next::Done(done))) => match written(&done.output, room) {
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

/// The most room [`written`] starts with.
const MAX_ROOM: usize = 64 * 1024;

/// `output` as JSON, written into `room` bytes to begin with: in
/// serde_json's one form, which the host passes on as it is (see
/// [`canonical`](crate::canonical)).
fn written(output: &Output, room: usize) -> Result<String, String> {
    canonical::to_string(output, room)
        .or_else(|_| serde_json::to_string(output))
        .map_err(|e| e.to_string())
}

extern "C" fn manifest_json<P: Provider>() -> RString {
    let manifest = match caught(P::manifest) {
        Ok(manifest) => serde_json::to_value(manifest),
        Err(payload) => {
            let mut why = serde_json::Map::new();
            why.insert(PANICKED.into(), panic_message(&*payload).into());
            Ok(serde_json::Value::Object(why))
        }
    };
    let mut manifest = match manifest {
        // An empty string is an unreadable manifest, which fails the load.
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => return RString::new(),
    };
    // The manifest's one fact about the build: whether a panic unwinds (to
    // be caught here) or aborts the process, the host with it.
    let strategy = if cfg!(panic = "unwind") {
        "unwind"
    } else {
        "abort"
    };
    manifest.insert(PANIC_STRATEGY.into(), strategy.into());
    serde_json::to_string(&manifest).unwrap_or_default().into()
}

/// The manifest's field for how the library was built to panic, beside
/// what [`Provider::manifest`] says (read by the host's `Build`).
const PANIC_STRATEGY: &str = "panic_strategy";
/// The manifest's field, alone, when [`Provider::manifest`] panicked: why.
const PANICKED: &str = "manifest_panicked";

extern "C" fn instantiate<P: Provider>(
    config: RStr<'_>,
    host: HostServices,
) -> RResult<FfiProviderBox, RString> {
    crate::log::install(host);
    let created = caught(|| {
        let config: ProviderConfig = serde_json::from_str(config.as_str())
            .map_err(|e| format!("unreadable provider config: {e}"))?;
        P::new(config)
    });
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
/// ```text
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
