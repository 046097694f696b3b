//! The binary interface between host and plugins, built on `abi_stable`.
//!
//! Three jobs, three places: this module holds the ABI types; [`plugin`]
//! adapts a safe [`Provider`](crate::Provider) to them (plugin authors only
//! ever use [`export_provider!`](crate::export_provider) from it); [`host`]
//! loads libraries and gives the host safe handles: [`Library`],
//! [`ProviderHandle`] and [`AttemptHandle`].
//!
//! The control flow (steps, requests, errors) crosses as `StableAbi` types
//! whose layout `abi_stable` checks at load. The normalized data and the
//! call parameters cross as JSON written and read by this crate on both
//! sides, so the schema has one definition and a plugin cannot smuggle
//! another shape past the host's strict decoding.
//!
//! Every call into plugin code runs inside `catch_unwind`: a panic becomes an
//! [`ErrorKind::Panicked`](crate::ErrorKind::Panicked) failure, never an abort of the host.

// abi_stable's derive and sabi_trait macros emit impls inside consts, which
// the `non_local_definitions` lint flags. They are sound; allow it here only.
#![allow(non_local_definitions)]

pub mod elf;
pub mod host;
pub mod plugin;
pub mod secret;

pub use host::{
    caller_message, Advance, Answer, AttemptHandle, Library, LoadError, ProviderHandle,
    MAX_CALLER_MESSAGE, MAX_CURSOR_LEN, MAX_STEPS, STEP_BUDGET,
};
#[doc(hidden)]
pub use plugin::{lib_header, root_module, LibHeader};

use abi_stable::library::RootModule;
use abi_stable::std_types::{RBox, ROption, RResult, RSlice, RStr, RString, RVec, Tuple2};
use abi_stable::{declare_root_module_statics, package_version_strings, sabi_trait, StableAbi};

use crate::ProviderError;

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// The provider's [`Manifest`](crate::Manifest) as JSON.
    pub manifest: extern "C" fn() -> RString,
    /// Sets up a provider from a [`ProviderConfig`](crate::ProviderConfig) as JSON.
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
    /// Starts an attempt for a [`Call`](crate::Call) given as JSON.
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
