//! A builder for `platforms.toml`, written into a scratch folder that lives
//! as long as the [`Config`].

use std::path::{Path, PathBuf};

use crate::paths;

/// The provider names the default operator config uses.
pub const PRIMARY: &str = "shortvideo-primary";
pub const FALLBACK: &str = "shortvideo-fallback";
pub const CHAOS: &str = "chaos";

/// The upstream keys and the variables that carry them to the server.
pub const PRIMARY_KEY_ENV: &str = "SG_TEST_PRIMARY_KEY";
pub const PRIMARY_KEY: &str = "pk-test-primary-5b1e0c";
pub const FALLBACK_KEY_ENV: &str = "SG_TEST_FALLBACK_KEY";
pub const FALLBACK_KEY: &str = "fk-test-fallback-91d7aa";
pub const CHAOS_KEY_ENV: &str = "SG_TEST_CHAOS_KEY";

/// The environment every server and command of the tests gets.
pub fn standard_env() -> Vec<(String, String)> {
    vec![
        (PRIMARY_KEY_ENV.into(), PRIMARY_KEY.into()),
        (FALLBACK_KEY_ENV.into(), FALLBACK_KEY.into()),
        (CHAOS_KEY_ENV.into(), "chaos-key-unused".into()),
    ]
}

/// A string as a TOML basic string. JSON's escapes are a subset of TOML's.
pub fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// One `[providers.NAME]` table.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    pub name: String,
    pub library: String,
    pub base_url: String,
    pub api_key_env: String,
    pub timeout_ms: u64,
    /// Further `key = value` lines of the table.
    pub lines: Vec<String>,
    /// The body of `[providers.NAME.settings]`, as TOML lines.
    pub settings: Option<String>,
}

#[derive(Debug, Clone)]
struct PlatformSpec {
    name: String,
    status: String,
    providers: Vec<String>,
    endpoints: Vec<(String, Vec<String>)>,
    /// `description`; `None`: [`paths::description`] for a live platform,
    /// none for a planned one.
    description: Option<PathBuf>,
}

/// Builds a `platforms.toml`. `[server]` always names a scratch keys file
/// and state folder and the build's plugin folder, and listens on port 0.
/// The response cache is off unless [`ConfigBuilder::cache`] sets it: the
/// suites of other concerns count what reaches the upstreams.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    plugin_dir: Option<PathBuf>,
    server_lines: Vec<String>,
    platforms: Vec<PlatformSpec>,
    providers: Vec<ProviderSpec>,
    /// The body of `[cache]`; `None`: `enabled = false`.
    cache: Option<String>,
    raw: Vec<String>,
}

impl ConfigBuilder {
    pub fn new() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// A valid config of both providers whose upstreams are never reached
    /// (port 9, discard): for tests of the files and the command line.
    pub fn unreached() -> ConfigBuilder {
        ConfigBuilder::new()
            .platform("shortvideo", "live", &[PRIMARY, FALLBACK])
            .endpoint_order("shortvideo", "search", &[FALLBACK])
            .primary("http://127.0.0.1:9")
            .fallback("http://127.0.0.1:9")
    }

    /// Loads plugins from `dir` instead of the build's folder.
    pub fn plugin_dir(mut self, dir: &Path) -> ConfigBuilder {
        self.plugin_dir = Some(dir.to_path_buf());
        self
    }

    /// Adds a line to `[server]`, e.g. `cursor_key_env = "X"`.
    pub fn server_line(mut self, line: &str) -> ConfigBuilder {
        self.server_lines.push(line.to_owned());
        self
    }

    /// Adds `[platforms.NAME]` with its status and failover order.
    pub fn platform(mut self, name: &str, status: &str, providers: &[&str]) -> ConfigBuilder {
        self.platforms.push(PlatformSpec {
            name: name.into(),
            status: status.into(),
            providers: providers.iter().map(|p| p.to_string()).collect(),
            endpoints: Vec::new(),
            description: None,
        });
        self
    }

    /// Names `file` as an already added platform's description.
    pub fn description(mut self, platform: &str, file: &Path) -> ConfigBuilder {
        let p = self
            .platforms
            .iter_mut()
            .find(|p| p.name == platform)
            .expect("add the platform before its description");
        p.description = Some(file.to_path_buf());
        self
    }

    /// Sets a per-endpoint order of an already added platform.
    pub fn endpoint_order(
        mut self,
        platform: &str,
        endpoint: &str,
        providers: &[&str],
    ) -> ConfigBuilder {
        let p = self
            .platforms
            .iter_mut()
            .find(|p| p.name == platform)
            .expect("add the platform before its endpoint order");
        p.endpoints.push((
            endpoint.into(),
            providers.iter().map(|p| p.to_string()).collect(),
        ));
        self
    }

    /// Adds `[providers.NAME]` with a 2 s timeout and no settings.
    pub fn provider(
        mut self,
        name: &str,
        library: &str,
        base_url: &str,
        api_key_env: &str,
    ) -> ConfigBuilder {
        self.providers.push(ProviderSpec {
            name: name.into(),
            library: library.into(),
            base_url: base_url.into(),
            api_key_env: api_key_env.into(),
            timeout_ms: 2000,
            lines: Vec::new(),
            settings: None,
        });
        self
    }

    /// Adds [`PRIMARY`], the `shortvideo_primary` library with its key
    /// variable, at `base_url` (a 2 s timeout, no settings).
    pub fn primary(self, base_url: &str) -> ConfigBuilder {
        self.provider(PRIMARY, "shortvideo_primary", base_url, PRIMARY_KEY_ENV)
    }

    /// Adds [`FALLBACK`], the `shortvideo_fallback` library with its key
    /// variable, at `base_url` (a 2 s timeout, no settings).
    pub fn fallback(self, base_url: &str) -> ConfigBuilder {
        self.provider(FALLBACK, "shortvideo_fallback", base_url, FALLBACK_KEY_ENV)
    }

    /// Changes an added provider's timeout.
    pub fn timeout_ms(mut self, provider: &str, ms: u64) -> ConfigBuilder {
        self.provider_mut(provider).timeout_ms = ms;
        self
    }

    /// Adds a `key = value` line to an added provider's table.
    pub fn provider_line(mut self, provider: &str, line: &str) -> ConfigBuilder {
        self.provider_mut(provider).lines.push(line.to_owned());
        self
    }

    /// Sets an added provider's `[providers.NAME.settings]` body (TOML lines).
    pub fn settings(mut self, provider: &str, body: &str) -> ConfigBuilder {
        self.provider_mut(provider).settings = Some(body.to_owned());
        self
    }

    /// The body of the `[cache]` table (e.g. `"enabled = true"`).
    pub fn cache(mut self, body: &str) -> ConfigBuilder {
        self.cache = Some(body.to_owned());
        self
    }

    /// Appends text to the file as it is (for deliberately bad configs).
    pub fn raw(mut self, text: &str) -> ConfigBuilder {
        self.raw.push(text.to_owned());
        self
    }

    fn provider_mut(&mut self, name: &str) -> &mut ProviderSpec {
        self.providers
            .iter_mut()
            .find(|p| p.name == name)
            .expect("add the provider first")
    }

    /// The file's text; `dir` is the folder it will be written to.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        out.push_str("[server]\n");
        out.push_str("listen = \"127.0.0.1:0\"\n");
        out.push_str("keys_file = \"keys.toml\"\n");
        let plugin_dir = self.plugin_dir.clone().unwrap_or_else(paths::target_dir);
        out.push_str(&format!(
            "plugin_dir = {}\n",
            toml_str(&paths::display(&plugin_dir))
        ));
        out.push_str("state_dir = \"state\"\n");
        // Tests run servers side by side: no fixed admin port.
        out.push_str("admin_listen = \"127.0.0.1:0\"\n");
        for line in &self.server_lines {
            out.push_str(line);
            out.push('\n');
        }
        for p in &self.platforms {
            out.push_str(&format!("\n[platforms.{}]\n", p.name));
            out.push_str(&format!("status = {}\n", toml_str(&p.status)));
            out.push_str(&format!("providers = {}\n", toml_list(&p.providers)));
            let description = match &p.description {
                Some(file) => Some(file.clone()),
                None if p.status == "live" => Some(paths::description(&p.name)),
                None => None,
            };
            if let Some(file) = description {
                out.push_str(&format!(
                    "description = {}\n",
                    toml_str(&paths::display(&file))
                ));
            }
            if !p.endpoints.is_empty() {
                out.push_str(&format!("[platforms.{}.endpoints]\n", p.name));
                for (endpoint, order) in &p.endpoints {
                    out.push_str(&format!("{endpoint} = {}\n", toml_list(order)));
                }
            }
        }
        for p in &self.providers {
            out.push_str(&format!("\n[providers.{}]\n", p.name));
            out.push_str(&format!("library = {}\n", toml_str(&p.library)));
            out.push_str(&format!("base_url = {}\n", toml_str(&p.base_url)));
            out.push_str(&format!("api_key_env = {}\n", toml_str(&p.api_key_env)));
            out.push_str(&format!("timeout_ms = {}\n", p.timeout_ms));
            for line in &p.lines {
                out.push_str(line);
                out.push('\n');
            }
            if let Some(settings) = &p.settings {
                out.push_str(&format!("[providers.{}.settings]\n{settings}\n", p.name));
            }
        }
        let cache = self.cache.as_deref().unwrap_or("enabled = false");
        out.push_str(&format!("\n[cache]\n{cache}\n"));
        for text in &self.raw {
            out.push('\n');
            out.push_str(text);
            out.push('\n');
        }
        out
    }

    /// Writes the file into a fresh scratch folder.
    pub fn write(&self) -> Config {
        Config::from_toml(&self.to_toml())
    }
}

/// A written `platforms.toml` and the scratch folder around it (keys file,
/// state folder, captured server output). Removed when dropped.
#[derive(Debug)]
pub struct Config {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl Config {
    /// Writes `text` as `platforms.toml` in a fresh scratch folder.
    pub fn from_toml(text: &str) -> Config {
        let dir = paths::scratch_dir();
        let path = dir.path().join("platforms.toml");
        std::fs::write(&path, text).expect("can write the config");
        Config { dir, path }
    }

    /// Replaces the file's text.
    pub fn rewrite(&self, text: &str) {
        std::fs::write(&self.path, text).expect("can write the config");
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The folder the config is in; relative paths in it resolve here.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The keys file the config names.
    pub fn keys_file(&self) -> PathBuf {
        self.dir().join("keys.toml")
    }

    /// The config's text as written.
    pub fn text(&self) -> String {
        std::fs::read_to_string(&self.path).expect("can read the config")
    }
}
