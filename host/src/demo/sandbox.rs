// Placeholder until the sandbox lands (being written now).
pub struct Sandbox {
    pub primary_url: String,
    pub fallback_url: String,
}
pub const PRIMARY_KEY: &str = "sandbox-primary-key";
pub const FALLBACK_KEY: &str = "sandbox-fallback-key";
impl Sandbox {
    pub async fn start(_fail_primary: bool) -> std::io::Result<Sandbox> {
        Err(std::io::Error::other("sandbox not built yet"))
    }
    pub fn known_usernames() -> &'static [&'static str] {
        &["lunabakes"]
    }
    pub fn known_post_ids() -> &'static [&'static str] {
        &["7312345678901234567"]
    }
}
