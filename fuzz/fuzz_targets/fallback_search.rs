#![no_main]
//! The fallback's search (F5).

use socialgate_fuzz::{calls, drive, provider};
use std::sync::OnceLock;

static PROVIDER: OnceLock<shortvideo_fallback::Fallback> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let provider = PROVIDER.get_or_init(provider);
    drive(provider, calls::search(None), data);
});
