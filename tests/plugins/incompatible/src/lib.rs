//! `incompatible`: a library that looks like a socialgate plugin to the
//! dynamic loader but was built against another plugin interface, so the
//! tests can prove the host refuses it (at start, on `check`, and on a live
//! reload, where the old table must keep serving).
//!
//! It exports an `abi_stable` root module with plugin-api's names
//! (`PluginModule`, `PluginModuleRef`, base name `socialgate_provider`) and
//! version (1.0.0, from this crate's own version), so the version check
//! passes, but with other field types: `abi_stable`'s layout check must
//! refuse it before any of its functions is called.

// abi_stable's derive and export macros emit impls inside consts, which the
// `non_local_definitions` lint flags. They are sound; allow them here.
#![allow(non_local_definitions)]

use abi_stable::library::RootModule;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::StableAbi;
use abi_stable::{declare_root_module_statics, export_root_module, package_version_strings};

/// plugin-api's root module by name, not by layout: `manifest` returns a
/// number instead of a string, `instantiate` takes nothing.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    pub manifest: extern "C" fn() -> u32,
    #[sabi(last_prefix_field)]
    pub instantiate: extern "C" fn(),
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "socialgate_provider";
    const NAME: &'static str = "socialgate provider";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

extern "C" fn manifest() -> u32 {
    0
}

extern "C" fn instantiate() {}

#[export_root_module]
fn root_module() -> PluginModuleRef {
    PluginModule {
        manifest,
        instantiate,
    }
    .leak_into_prefix()
}
