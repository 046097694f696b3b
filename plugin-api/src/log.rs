//! Logging from inside a plugin. Each plugin library has its own copy of
//! every static (a `tracing` subscriber set in the host is invisible here), so
//! log lines travel to the host through a callback it hands over at set-up.
//!
//! Use the macros: `plugin_api::warn!("upstream sent {n} items")`. Never log
//! the upstream key or request headers.

use std::fmt;
use std::sync::OnceLock;

use crate::ffi::HostServices;

/// How severe a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    /// Unknown levels (a newer plugin) are logged as debug.
    pub fn from_u8(level: u8) -> Level {
        match level {
            1 => Level::Error,
            2 => Level::Warn,
            3 => Level::Info,
            _ => Level::Debug,
        }
    }
}

static HOST: OnceLock<HostServices> = OnceLock::new();

pub(crate) fn install(host: HostServices) {
    // Every instance of one library gets the same host; the first one wins.
    let _ = HOST.set(host);
}

/// Sends one line to the host's log; dropped before set-up.
#[doc(hidden)]
pub fn emit(level: Level, target: &str, message: fmt::Arguments<'_>) {
    if let Some(host) = HOST.get() {
        let message = message.to_string();
        (host.log)(level as u8, target.into(), message.as_str().into());
    }
}

/// Logs an error through the host.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::emit($crate::log::Level::Error, module_path!(), format_args!($($arg)+)) };
}

/// Logs a warning through the host.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::emit($crate::log::Level::Warn, module_path!(), format_args!($($arg)+)) };
}

/// Logs an informational line through the host.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::emit($crate::log::Level::Info, module_path!(), format_args!($($arg)+)) };
}

/// Logs a debug line through the host.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::emit($crate::log::Level::Debug, module_path!(), format_args!($($arg)+)) };
}
