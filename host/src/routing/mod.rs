//! The routing table: which providers, in which order, serve each endpoint
//! of each platform. Built whole from the serving configuration's platforms
//! and providers (libraries loaded, providers set up, chains assembled)
//! before anything serves from it.
//!
//! A rebuild reuses what has not changed: a provider with the same library
//! content, upstream, key and settings keeps its plugin instance and its
//! breaker's state (under its new breaker settings, if they changed), so a
//! reload does not forget that an upstream is down.

pub mod config;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use platform_description::{Description, Validated};
use plugin_api::ffi::{Library, ProviderHandle};
use plugin_api::{Call, Endpoint};

use self::config::{PlatformConfig, PlatformStatus, ProviderConfig};
use crate::error::ApiError;
use crate::plugins::{self, ContentHash, Loader, PluginError};
use crate::resilience::breaker::Breaker;
use crate::resilience::concurrency::ConcurrencyLimit;
use crate::resilience::runaway::StepRunner;
use crate::upstream::Origin;

/// A configured provider, ready to serve.
pub struct Provider {
    /// Its name in the config (`[providers.NAME]`); shared by what names
    /// it for a request (the answer, its log line, its metrics).
    pub name: Arc<str>,
    pub handle: Arc<ProviderHandle>,
    /// Bounds one attempt, all its steps together.
    pub timeout: Duration,
    /// Larger upstream bodies are bad responses.
    pub max_body_bytes: usize,
    /// Where its plugin's requests may go.
    pub origin: Origin,
    pub breaker: Arc<Breaker>,
    /// Its attempts in flight, at most `max_in_flight`.
    pub in_flight: ConcurrencyLimit,
    /// Runs its plugin's calls; keeps a runaway plugin off request threads.
    pub runner: Arc<StepRunner>,
    /// Which plugin serves it, for `check` and the logs.
    pub plugin: PluginInfo,
}

/// A provider's plugin as its library describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The manifest's name and version.
    pub name: String,
    pub version: String,
    /// The plugin-api version the library was built against.
    pub plugin_api: String,
    pub endpoints: Vec<Endpoint>,
    /// The library file, as configured.
    pub library: PathBuf,
}

impl PluginInfo {
    fn of(library: &Library, path: &Path) -> PluginInfo {
        let manifest = library.manifest();
        PluginInfo {
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            plugin_api: library.plugin_api_version().to_owned(),
            endpoints: manifest.endpoints.clone(),
            library: path.to_owned(),
        }
    }
}

/// `plugin NAME VERSION`, as logs and `check` name it.
impl std::fmt::Display for PluginInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plugin {} {}", self.name, self.version)
    }
}

/// Providers for one endpoint, in failover order.
pub type Chain = Arc<[Arc<Provider>]>;

enum Platform {
    Planned,
    Live(LivePlatform),
}

/// A live platform: its description, and a chain for each endpoint it
/// describes that some provider serves.
struct LivePlatform {
    description: Arc<Description>,
    /// By the endpoint's index in the description; `None`: no provider
    /// serves it.
    chains: Vec<Option<(Endpoint, Chain)>>,
}

/// One endpoint of a loaded description, owned: what an attempt checks
/// its answer against, on whatever task it ends.
#[derive(Clone)]
pub struct DescribedEndpoint {
    description: Arc<Description>,
    /// Its index among the description's endpoints.
    index: usize,
}

impl DescribedEndpoint {
    pub fn get(&self) -> &platform_description::Endpoint {
        &self.description.endpoints()[self.index]
    }

    /// The description's default cache lifetime of its answers.
    pub fn cache_ttl(&self) -> Duration {
        Duration::from_secs(self.get().cache_ttl_s())
    }
}

/// What serves `/v1/{platform}/{endpoint}`.
pub struct Route<'r> {
    /// The endpoint as plugin-api 1.x names it.
    pub endpoint: Endpoint,
    pub described: DescribedEndpoint,
    pub chain: &'r Chain,
}

/// What a plugin instance was set up from: equal identities can share one.
#[derive(PartialEq)]
struct Identity {
    library: ContentHash,
    base_url: String,
    api_key: String,
    settings: serde_json::Value,
}

struct Slot {
    identity: Identity,
    provider: Arc<Provider>,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("{config}: [platforms.{platform}] lists provider `{provider}`, whose library serves platform `{serves}`")]
    WrongPlatform {
        config: String,
        platform: String,
        provider: String,
        serves: String,
    },
    #[error(transparent)]
    EndpointNotServed(Box<NotServed>),
    #[error("{config}: [platforms.{platform}] is live without a description")]
    Undescribed { config: String, platform: String },
    #[error("{file}: endpoint `{endpoint}` cannot be served by plugin-api 1.x plugins: {reason}")]
    Unservable {
        file: String,
        endpoint: String,
        reason: &'static str,
    },
}

/// A provider listed by name for an endpoint its manifest does not serve
/// (boxed: errors travel by value through every start and reload).
#[derive(Debug, thiserror::Error)]
#[error("{config}: [platforms.{platform}.endpoints] lists provider `{provider}` for `{endpoint}`, which its library ({plugin}) does not serve; it serves: {serves}")]
pub struct NotServed {
    config: String,
    platform: String,
    provider: String,
    endpoint: Endpoint,
    plugin: String,
    serves: String,
}

pub struct Routes {
    platforms: HashMap<String, Platform>,
    providers: HashMap<String, Slot>,
    libraries: HashMap<PathBuf, ContentHash>,
}

impl Routes {
    /// Loads every configured provider and assembles the chains, reusing
    /// what `previous` already has for unchanged providers.
    pub fn build(
        config_path: &Path,
        platform_configs: &BTreeMap<String, PlatformConfig>,
        provider_configs: &BTreeMap<String, ProviderConfig>,
        loader: &Loader,
        previous: Option<&Routes>,
    ) -> Result<Routes, BuildError> {
        let mut providers = HashMap::new();
        let mut manifests = HashMap::new();
        let mut libraries = HashMap::new();
        for (name, provider_config) in provider_configs {
            let (library, hash) = loader.load(&provider_config.library)?;
            libraries.insert(provider_config.library.clone(), hash);
            crate::redact::remember(provider_config.api_key.expose());
            let identity = Identity {
                library: hash,
                base_url: provider_config.base_url.clone(),
                api_key: provider_config.api_key.expose().to_owned(),
                settings: provider_config.settings.clone(),
            };
            let before = previous.and_then(|p| p.providers.get(name));
            let plugin = PluginInfo::of(&library, &provider_config.library);
            let slot =
                reuse_or_create(name, provider_config, identity, before, plugin, |config| {
                    let plugin_config = plugin_api::ProviderConfig {
                        base_url: config.base_url.clone(),
                        api_key: config.api_key.expose().to_owned(),
                        settings: config.settings.clone(),
                    };
                    plugins::instantiate(
                        &library,
                        &config.library,
                        name,
                        &plugin_config,
                        config_path,
                    )
                })?;
            manifests.insert(name.as_str(), library.manifest().clone());
            providers.insert(name.clone(), slot);
        }

        let mut platforms = HashMap::new();
        for (platform_name, platform) in platform_configs {
            let routes = match platform.status {
                PlatformStatus::Planned => Platform::Planned,
                PlatformStatus::Live => {
                    let Some(described) = &platform.description else {
                        return Err(BuildError::Undescribed {
                            config: config_path.display().to_string(),
                            platform: platform_name.clone(),
                        });
                    };
                    let description = &described.description;
                    let mut chains = Vec::new();
                    for endpoint_described in description.endpoints() {
                        // An endpoint plugin-api 1.x has no name for has
                        // no plugin to serve it.
                        let Some(endpoint) = Endpoint::from_segment(endpoint_described.name())
                        else {
                            chains.push(None);
                            continue;
                        };
                        if let Err(reason) = fits_1x(endpoint, endpoint_described) {
                            return Err(BuildError::Unservable {
                                file: described.path.display().to_string(),
                                endpoint: endpoint.to_string(),
                                reason,
                            });
                        }
                        let mut chain = Vec::new();
                        for name in platform.order(endpoint) {
                            let manifest = &manifests[name.as_str()];
                            if manifest.platform != *platform_name {
                                return Err(BuildError::WrongPlatform {
                                    config: config_path.display().to_string(),
                                    platform: platform_name.clone(),
                                    provider: name.clone(),
                                    serves: manifest.platform.clone(),
                                });
                            }
                            // A provider that does not serve an endpoint is
                            // left out here, so it is never asked; listed
                            // for that endpoint by name, it is a mistake.
                            if manifest.endpoints.contains(&endpoint) {
                                chain.push(providers[name].provider.clone());
                            } else if platform.endpoints.contains_key(&endpoint) {
                                let plugin: &Provider = &providers[name].provider;
                                return Err(BuildError::EndpointNotServed(Box::new(NotServed {
                                    config: config_path.display().to_string(),
                                    platform: platform_name.clone(),
                                    provider: name.clone(),
                                    endpoint,
                                    plugin: plugin.plugin.to_string(),
                                    serves: endpoint_list(&manifest.endpoints),
                                })));
                            }
                        }
                        chains.push((!chain.is_empty()).then(|| (endpoint, chain.into())));
                    }
                    Platform::Live(LivePlatform {
                        description: description.clone(),
                        chains,
                    })
                }
            };
            platforms.insert(platform_name.clone(), routes);
        }
        Ok(Routes {
            platforms,
            providers,
            libraries,
        })
    }

    /// What serves `/v1/{platform}/{endpoint}`, checking the platform
    /// before the endpoint: an endpoint its description does not name, or
    /// that no provider serves, is not found.
    pub fn route(&self, platform: &str, endpoint: &str) -> Result<Route<'_>, ApiError> {
        let live = self.live(platform)?;
        let index = live
            .description
            .endpoints()
            .iter()
            .position(|e| e.name() == endpoint)
            .ok_or(ApiError::EndpointNotFound)?;
        let (endpoint, chain) = live.chains[index]
            .as_ref()
            .ok_or(ApiError::EndpointNotFound)?;
        Ok(Route {
            endpoint: *endpoint,
            described: DescribedEndpoint {
                description: live.description.clone(),
                index,
            },
            chain,
        })
    }

    /// A live platform; an unknown or planned one is an error.
    fn live(&self, platform: &str) -> Result<&LivePlatform, ApiError> {
        match self.platforms.get(platform) {
            None => Err(ApiError::platform_not_found(platform)),
            Some(Platform::Planned) => Err(ApiError::PlatformNotAvailable(platform.to_owned())),
            Some(Platform::Live(live)) => Ok(live),
        }
    }

    /// Whether `platform` is live; an unknown or planned one is an error.
    pub fn check_live(&self, platform: &str) -> Result<(), ApiError> {
        self.live(platform).map(|_| ())
    }

    pub fn platform_count(&self) -> usize {
        self.platforms.len()
    }

    pub fn provider_count(&self) -> usize {
        self.providers.len()
    }

    /// Every provider, sorted by name.
    pub fn providers_by_name(&self) -> Vec<&Arc<Provider>> {
        let mut all: Vec<_> = self.providers().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every provider, by name.
    pub fn providers(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.providers.values().map(|slot| &slot.provider)
    }

    /// Names of live platforms, for readiness.
    pub fn live_platforms(&self) -> impl Iterator<Item = &str> {
        self.platforms
            .iter()
            .filter(|(_, p)| matches!(p, Platform::Live(_)))
            .map(|(name, _)| name.as_str())
    }

    /// The endpoints of a live platform no provider serves (answered
    /// `ENDPOINT_NOT_FOUND`), in its description's order.
    pub fn unserved(&self, platform: &str) -> Vec<&str> {
        match self.platforms.get(platform) {
            Some(Platform::Live(live)) => live
                .description
                .endpoints()
                .iter()
                .zip(&live.chains)
                .filter(|(_, chain)| chain.is_none())
                .map(|(e, _)| e.name())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether a live platform has a provider for at least one endpoint.
    pub fn serves_anything(&self, platform: &str) -> bool {
        matches!(
            self.platforms.get(platform),
            Some(Platform::Live(live)) if live.chains.iter().any(Option::is_some)
        )
    }

    /// What changed from `before` to `self`, for the reload log.
    pub fn changes_since(&self, before: &Routes) -> Changes {
        let diff =
            |now: BTreeSet<&String>, then: BTreeSet<&String>| -> (Vec<String>, Vec<String>) {
                (
                    now.difference(&then).map(|s| s.to_string()).collect(),
                    then.difference(&now).map(|s| s.to_string()).collect(),
                )
            };
        let (platforms_added, platforms_removed) = diff(
            self.platforms.keys().collect(),
            before.platforms.keys().collect(),
        );
        let (providers_added, providers_removed) = diff(
            self.providers.keys().collect(),
            before.providers.keys().collect(),
        );
        // Added and replaced providers name the plugin now serving them,
        // so an operator sees which version a swap brought in.
        let with_plugin = |name: String| match self.providers.get(&name) {
            Some(slot) => format!("{name} ({})", slot.provider.plugin),
            None => name,
        };
        let providers_added = providers_added.into_iter().map(with_plugin).collect();
        let mut providers_replaced: Vec<String> =
            self.providers
                .iter()
                .filter(|(name, slot)| {
                    before.providers.get(*name).is_some_and(|old| {
                        !Arc::ptr_eq(&old.provider.handle, &slot.provider.handle)
                    })
                })
                .map(|(name, _)| with_plugin(name.clone()))
                .collect();
        providers_replaced.sort();
        let (mut libraries_added, mut libraries_changed) = (Vec::new(), Vec::new());
        for (path, hash) in &self.libraries {
            match before.libraries.get(path) {
                None => libraries_added.push(path.display().to_string()),
                Some(was) if was != hash => libraries_changed.push(path.display().to_string()),
                Some(_) => {}
            }
        }
        Changes {
            platforms_added,
            platforms_removed,
            providers_added,
            providers_removed,
            providers_replaced,
            libraries_added,
            libraries_changed,
        }
    }
}

/// The differences between two routing tables.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub platforms_added: Vec<String>,
    pub platforms_removed: Vec<String>,
    pub providers_added: Vec<String>,
    pub providers_removed: Vec<String>,
    /// Set up anew: library, upstream, key or settings changed.
    pub providers_replaced: Vec<String>,
    /// Libraries loaded that the table before had not.
    pub libraries_added: Vec<String>,
    /// Libraries whose file holds another library than before.
    pub libraries_changed: Vec<String>,
}

fn reuse_or_create(
    name: &str,
    config: &ProviderConfig,
    identity: Identity,
    before: Option<&Slot>,
    plugin: PluginInfo,
    create: impl FnOnce(&ProviderConfig) -> Result<ProviderHandle, PluginError>,
) -> Result<Slot, PluginError> {
    let same_instance = before.filter(|b| b.identity == identity);
    let (handle, runner) = match same_instance {
        Some(before) => (
            before.provider.handle.clone(),
            before.provider.runner.clone(),
        ),
        None => (Arc::new(create(config)?), StepRunner::new(name)),
    };
    let breaker = match same_instance {
        Some(before) if before.provider.breaker.config() == config.breaker => {
            before.provider.breaker.clone()
        }
        Some(before) => Arc::new(before.provider.breaker.with_config(config.breaker)),
        None => Arc::new(Breaker::new(config.breaker)),
    };
    // Kept like the breaker, so attempts still running on the previous
    // table count against the same limit.
    let in_flight = match same_instance {
        Some(before) if before.provider.in_flight.max() == config.max_in_flight => {
            before.provider.in_flight.clone()
        }
        _ => ConcurrencyLimit::new(config.max_in_flight),
    };
    Ok(Slot {
        identity,
        provider: Arc::new(Provider {
            name: name.into(),
            handle,
            timeout: config.timeout,
            max_body_bytes: config.max_body_bytes,
            origin: config.origin.clone(),
            breaker,
            in_flight,
            runner,
            plugin,
        }),
    })
}

/// Whether plugin-api 1.x's `endpoint` can be asked for what the
/// description's endpoint reads: [`call_1x`] needs a page size for a
/// list, one a `u32` holds.
fn fits_1x(
    endpoint: Endpoint,
    described: &platform_description::Endpoint,
) -> Result<(), &'static str> {
    if endpoint.is_list() != described.is_list() {
        return Err("a list in plugin-api 1.x and in the description, or one object in both");
    }
    if endpoint.is_list() {
        let Some(page_size) = described.page_size() else {
            return Err("a list needs a page size");
        };
        match page_size.kind() {
            platform_description::ParameterKind::Integer(rule)
                if u32::try_from(rule.max).is_ok() => {}
            _ => return Err("its page size must be an integer of at most 4294967295"),
        }
    }
    Ok(())
}

/// The plugin-api 1.x call for parameters the description validated: the
/// one place that still maps an endpoint's values to 1.x's fixed shapes,
/// by role (subject, page size), not by name. The switch to plugin-api
/// 2.0, whose calls carry the values by name, removes it.
pub fn call_1x(endpoint: Endpoint, asked: &Validated<'_>) -> Call {
    let subject = asked.subject().to_owned();
    // `fits_1x` held when the route was built: a list's page size is
    // there and fits.
    let count = asked
        .page_size()
        .and_then(|size| u32::try_from(size).ok())
        .unwrap_or_default();
    match endpoint {
        Endpoint::Profile => Call::Profile { username: subject },
        Endpoint::Posts => Call::Posts {
            username: subject,
            count,
            cursor: None,
        },
        Endpoint::Post => Call::Post { id: subject },
        Endpoint::Comments => Call::Comments {
            id: subject,
            count,
            cursor: None,
        },
        Endpoint::Search => Call::Search {
            query: subject,
            count,
            cursor: None,
        },
    }
}

/// `profile, posts`, for messages.
pub fn endpoint_list(endpoints: &[Endpoint]) -> String {
    let names: Vec<&str> = endpoints.iter().map(|e| e.as_str()).collect();
    names.join(", ")
}

impl Changes {
    /// Nothing added, removed or set up anew.
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = [
            ("platforms added", &self.platforms_added),
            ("platforms removed", &self.platforms_removed),
            ("providers added", &self.providers_added),
            ("providers removed", &self.providers_removed),
            ("providers set up anew", &self.providers_replaced),
            ("libraries added", &self.libraries_added),
            ("libraries changed", &self.libraries_changed),
        ];
        let mut any = false;
        for (what, names) in parts.iter().filter(|(_, names)| !names.is_empty()) {
            write!(
                f,
                "{}{what}: {}",
                if any { "; " } else { "" },
                names.join(", ")
            )?;
            any = true;
        }
        if !any {
            f.write_str("nothing changed")?;
        }
        Ok(())
    }
}
