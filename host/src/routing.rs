//! The routing table: which providers, in which order, serve each endpoint
//! of each platform. Built whole from a [`Config`] (libraries loaded,
//! providers set up, chains assembled) before anything serves from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use plugin_api::ffi::ProviderHandle;
use plugin_api::Endpoint;

use crate::config::{Config, PlatformStatus};
use crate::error::ApiError;
use crate::plugins::{self, Loader, PluginError};
use crate::resilience::breaker::Breaker;

/// A configured provider, ready to serve.
pub struct Provider {
    /// Its name in the config (`[providers.NAME]`).
    pub name: String,
    pub handle: ProviderHandle,
    /// Bounds one attempt, all its steps together.
    pub timeout: Duration,
    /// Larger upstream bodies are bad responses.
    pub max_body_bytes: usize,
    pub breaker: Breaker,
}

/// Providers for one endpoint, in failover order.
pub type Chain = Arc<[Arc<Provider>]>;

enum Platform {
    Planned,
    /// Endpoints no provider serves are absent.
    Live(HashMap<Endpoint, Chain>),
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
}

pub struct Routes {
    platforms: HashMap<String, Platform>,
    providers: usize,
}

impl Routes {
    /// Loads every configured provider and assembles the chains.
    pub fn build(config: &Config, loader: &Loader) -> Result<Routes, BuildError> {
        let mut providers = HashMap::new();
        let mut serves = HashMap::new();
        for (name, provider) in &config.providers {
            let library = loader.load(&provider.library)?;
            let handle = plugins::instantiate(&library, name, provider)?;
            serves.insert(name.as_str(), library.manifest().clone());
            providers.insert(
                name.as_str(),
                Arc::new(Provider {
                    name: name.clone(),
                    handle,
                    timeout: provider.timeout,
                    max_body_bytes: provider.max_body_bytes,
                    breaker: Breaker::new(provider.breaker),
                }),
            );
        }

        let mut platforms = HashMap::new();
        for (platform_name, platform) in &config.platforms {
            let routes = match platform.status {
                PlatformStatus::Planned => Platform::Planned,
                PlatformStatus::Live => {
                    let mut chains = HashMap::new();
                    for endpoint in Endpoint::ALL {
                        let mut chain = Vec::new();
                        for name in platform.order(endpoint) {
                            let manifest = &serves[name.as_str()];
                            if manifest.platform != *platform_name {
                                return Err(BuildError::WrongPlatform {
                                    config: config.path.display().to_string(),
                                    platform: platform_name.clone(),
                                    provider: name.clone(),
                                    serves: manifest.platform.clone(),
                                });
                            }
                            // A provider that does not serve an endpoint is
                            // left out here, so it is never asked.
                            if manifest.endpoints.contains(&endpoint) {
                                chain.push(providers[name.as_str()].clone());
                            }
                        }
                        if !chain.is_empty() {
                            chains.insert(endpoint, chain.into());
                        }
                    }
                    Platform::Live(chains)
                }
            };
            platforms.insert(platform_name.clone(), routes);
        }
        Ok(Routes {
            platforms,
            providers: providers.len(),
        })
    }

    /// The chain for `/v1/{platform}/{endpoint}`, checking the platform
    /// before the endpoint.
    pub fn route(&self, platform: &str, endpoint: &str) -> Result<(Endpoint, &Chain), ApiError> {
        match self.platforms.get(platform) {
            None => Err(ApiError::platform_not_found(platform)),
            Some(Platform::Planned) => Err(ApiError::PlatformNotAvailable(platform.to_owned())),
            Some(Platform::Live(chains)) => Endpoint::from_segment(endpoint)
                .and_then(|e| chains.get(&e).map(|chain| (e, chain)))
                .ok_or(ApiError::EndpointNotFound),
        }
    }

    /// Whether `platform` is known at all, for paths too short to route.
    pub fn check_platform(&self, platform: &str) -> Result<(), ApiError> {
        match self.platforms.get(platform) {
            None => Err(ApiError::platform_not_found(platform)),
            Some(Platform::Planned) => Err(ApiError::PlatformNotAvailable(platform.to_owned())),
            Some(Platform::Live(_)) => Ok(()),
        }
    }

    pub fn platform_count(&self) -> usize {
        self.platforms.len()
    }

    pub fn provider_count(&self) -> usize {
        self.providers
    }
}
