#![no_main]
//! The primary's post (P3).

use socialgate_fuzz::{calls, drive, provider};
use std::sync::OnceLock;

static PROVIDER: OnceLock<shortvideo_primary::Primary> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let provider = PROVIDER.get_or_init(provider);
    drive(provider, calls::post(), data);
});
