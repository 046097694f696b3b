//! A circuit breaker per provider: after enough consecutive failures the
//! provider is skipped, with no upstream call, until a cooldown ends; then
//! one probe decides whether it is back.
//!
//! A dead primary would otherwise make every request pay its timeout before
//! the fallback answers. An upstream's rate limit opens the breaker at once,
//! for its `Retry-After` ([`RATE_LIMITED_FOR`] when it gives none): it says
//! when to come back, where the cooldown is for failures whose end no one
//! knows (a 1-request-a-second limit must not take a provider out for the
//! whole cooldown). Which [`Outcome`] an
//! attempt's result is (a "not found" is a success, input refused before
//! any request is neutral, ...) is the failover verdict's to say:
//! [`crate::chain::decision`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Defaults of `breaker_failures` and `breaker_cooldown_ms`.
pub const DEFAULT_FAILURES: u32 = 5;
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);
/// The longest an upstream's `Retry-After` can keep a breaker open: an
/// upstream must not be able to switch itself off for good.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How long a rate limit that says no `Retry-After` keeps a provider out:
/// the contract's limits are per second.
pub const RATE_LIMITED_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// How long it stays open.
    pub cooldown: Duration,
}

impl BreakerConfig {
    /// `breaker_failures` and `breaker_cooldown_ms` of the provider table
    /// `table`.
    pub fn from_raw(
        failures: Option<u32>,
        cooldown_ms: Option<u64>,
        table: &str,
        cx: &crate::settings::Context,
    ) -> Result<BreakerConfig, crate::settings::ConfigError> {
        Ok(BreakerConfig {
            failures: cx.positive(
                &format!("{table} breaker_failures"),
                failures,
                DEFAULT_FAILURES,
            )?,
            // 0 is allowed: every failure past the threshold probes again.
            cooldown: cooldown_ms.map_or(DEFAULT_COOLDOWN, Duration::from_millis),
        })
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: DEFAULT_FAILURES,
            cooldown: DEFAULT_COOLDOWN,
        }
    }
}

/// At most one forced probe of a provider per this long: when every
/// provider of a chain is open, the forced probe lets a dead chain recover
/// quickly, but must not turn into one upstream call per incoming request.
pub const FORCED_PROBE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        /// Opened by a 429: the upstream said when to come back, and it
        /// is never asked before (no forced probe either).
        rate_limited: bool,
    },
    /// Cooldown over; one probe is in flight and others keep away.
    Probing,
}

/// The state, and when a probe was last forced.
#[derive(Debug)]
struct Inner {
    state: State,
    last_forced: Option<Instant>,
}

/// How an attempt through the breaker went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Quota exhausted; the upstream may say for how long.
    RateLimited(Option<Duration>),
    /// The attempt never reached the upstream (the plugin refused the
    /// input): it says nothing about the provider's health.
    Neutral,
}

/// A change of a breaker's state ([`Breaker::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Requests skip the provider from now, for about this many seconds
    /// (then one probe decides); `rate_limited`: the upstream said so.
    Opened { for_secs: u64, rate_limited: bool },
    /// A success: requests go to the provider again.
    Closed,
}

impl Turn {
    /// Logs the turn of `provider`'s breaker: an operator sees why traffic
    /// moved to the next provider, and when it came back.
    pub fn log(self, provider: &str) {
        match self {
            Turn::Opened {
                for_secs,
                rate_limited: false,
            } => tracing::warn!(
                provider,
                for_secs,
                "breaker opened after consecutive failures: requests skip this provider until a probe succeeds"
            ),
            Turn::Opened {
                for_secs,
                rate_limited: true,
            } => tracing::warn!(
                provider,
                for_secs,
                "breaker opened: the upstream is rate limiting; requests skip this provider until it said to come back"
            ),
            Turn::Closed => tracing::info!(provider, "breaker closed: the provider answers again"),
        }
    }
}

/// Leave to make one attempt. Report how it went with
/// [`Breaker::record`]. A probe dropped unreported counts as a failed probe:
/// otherwise a provider that hangs until callers give up would be probed
/// again at once, forever.
#[must_use]
pub struct Permit {
    breaker: Arc<Breaker>,
    probe: bool,
    reported: bool,
}

impl Permit {
    #[cfg(test)]
    fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.probe && !self.reported {
            let mut inner = self.breaker.lock();
            if inner.state == State::Probing {
                inner.state = State::Open {
                    until: Instant::now() + self.breaker.config.cooldown,
                    rate_limited: false,
                };
            }
        }
    }
}

#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            inner: Mutex::new(Inner {
                state: State::Closed { failures: 0 },
                last_forced: None,
            }),
        }
    }

    pub fn config(&self) -> BreakerConfig {
        self.config
    }

    /// A breaker with `config` where this one stands: an operator who
    /// changes a provider's breaker settings during an incident must not
    /// put a dead upstream back into traffic. An open breaker stays open
    /// until the instant it was opened for (the new cooldown counts from
    /// the next opening); a probe in flight reports to this breaker, so
    /// the new one lets the next request probe instead of waiting for it.
    /// A copy: what attempts still running on the previous table report
    /// after it goes to this breaker, not the new one (a reload's moment;
    /// the next failures open the new one as they would have).
    pub fn with_config(&self, config: BreakerConfig) -> Breaker {
        let inner = self.lock();
        let state = match inner.state {
            State::Probing => State::Open {
                until: Instant::now(),
                rate_limited: false,
            },
            state => state,
        };
        Breaker {
            config,
            inner: Mutex::new(Inner {
                state,
                last_forced: inner.last_forced,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a plain value: a panic elsewhere cannot tear it.
        crate::sync::lock(&self.inner)
    }

    /// Leave to attempt now, or the instant the provider may be tried again.
    pub fn try_acquire(self: &Arc<Self>, now: Instant) -> Result<Permit, Instant> {
        let mut inner = self.lock();
        match inner.state {
            State::Closed { .. } => Ok(self.permit(false)),
            State::Open { until, .. } if now >= until => {
                inner.state = State::Probing;
                Ok(self.permit(true))
            }
            State::Open { until, .. } => Err(until),
            // Another request is probing; it decides.
            State::Probing => Err(now),
        }
    }

    /// Leave to probe before the cooldown ends: used when every provider of
    /// a chain is open, so a dead chain recovers without waiting out the
    /// whole cooldown. `None` while another probe is in flight (one probe
    /// at a time decides), within [`FORCED_PROBE_EVERY`] of the last forced
    /// probe, and for a breaker a 429 opened: that upstream is never asked
    /// before its `Retry-After`.
    pub fn force_acquire(self: &Arc<Self>, now: Instant) -> Option<Permit> {
        let mut inner = self.lock();
        let paced = inner
            .last_forced
            .is_some_and(|last| now.saturating_duration_since(last) < FORCED_PROBE_EVERY);
        match inner.state {
            State::Closed { .. } => Some(self.permit(false)),
            State::Open {
                rate_limited: false,
                ..
            } if !paced => {
                inner.state = State::Probing;
                inner.last_forced = Some(now);
                Some(self.permit(true))
            }
            State::Open { .. } | State::Probing => None,
        }
    }

    /// The soonest instant this provider may be asked again (`now` if it
    /// may be asked now): its cooldown's end, or for a breaker opened by
    /// failures the next forced probe, whichever comes first.
    pub fn next_chance(&self, now: Instant) -> Instant {
        let inner = self.lock();
        let next_forced = inner
            .last_forced
            .map_or(now, |last| last + FORCED_PROBE_EVERY);
        match inner.state {
            State::Closed { .. } => now,
            State::Open {
                until,
                rate_limited: true,
            } => until,
            State::Open { until, .. } => until.min(next_forced).max(now),
            State::Probing => next_forced.max(now + FORCED_PROBE_EVERY.min(self.config.cooldown)),
        }
    }

    fn permit(self: &Arc<Self>, probe: bool) -> Permit {
        Permit {
            breaker: self.clone(),
            probe,
            reported: false,
        }
    }

    /// Records how the attempt under `permit` went; says when that opened
    /// or closed the breaker, which an operator should hear of.
    pub fn record(&self, mut permit: Permit, outcome: Outcome, now: Instant) -> Option<Turn> {
        permit.reported = true;
        let mut inner = self.lock();
        let before = inner.state;
        inner.state = match (outcome, inner.state) {
            (Outcome::Success, _) => State::Closed { failures: 0 },
            // Nothing learnt: a probe lets the next request probe.
            (Outcome::Neutral, State::Probing) => State::Open {
                until: now,
                rate_limited: false,
            },
            (Outcome::Neutral, unchanged) => unchanged,
            (Outcome::RateLimited(after), _) => State::Open {
                until: now + after.unwrap_or(RATE_LIMITED_FOR).min(MAX_RETRY_AFTER),
                rate_limited: true,
            },
            (Outcome::Failure, State::Closed { failures })
                if failures + 1 < self.config.failures =>
            {
                State::Closed {
                    failures: failures + 1,
                }
            }
            // Threshold reached, a probe failed, or a forced attempt failed.
            (Outcome::Failure, _) => State::Open {
                until: now + self.config.cooldown,
                rate_limited: false,
            },
        };
        match (before, inner.state) {
            (
                State::Closed { .. },
                State::Open {
                    until,
                    rate_limited,
                },
            ) => Some(Turn::Opened {
                for_secs: until.saturating_duration_since(now).as_secs_f64().ceil() as u64,
                rate_limited,
            }),
            (State::Open { .. } | State::Probing, State::Closed { .. }) => Some(Turn::Closed),
            _ => None,
        }
    }

    /// Whether requests currently skip this provider.
    pub fn is_open(&self) -> bool {
        !matches!(self.lock().state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(10),
        }))
    }

    fn fail(b: &Arc<Breaker>, now: Instant) {
        let permit = b.try_acquire(now).expect("closed");
        b.record(permit, Outcome::Failure, now);
    }

    #[test]
    fn new_settings_keep_where_the_breaker_stands() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            fail(&b, t);
        }
        let longer = BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(60),
        };
        let again = Arc::new(b.with_config(longer));
        assert_eq!(again.config(), longer);
        assert!(again.is_open(), "still open");
        assert_eq!(
            again.try_acquire(t + Duration::from_secs(9)).err(),
            Some(t + Duration::from_secs(10)),
            "until the instant it was opened for"
        );
        // A probe in flight on the old breaker: the new one lets the next
        // request probe rather than wait for a report it will never get.
        let probe = b.try_acquire(t + Duration::from_secs(10)).expect("a probe");
        let again = Arc::new(b.with_config(longer));
        assert!(again.try_acquire(t + Duration::from_secs(10)).is_ok());
        drop(probe);
        // Closed with failures counted: the count goes on.
        let b = breaker();
        fail(&b, t);
        fail(&b, t);
        let again = Arc::new(b.with_config(longer));
        fail(&again, t);
        assert!(again.is_open());
    }

    #[test]
    fn rate_limit_opens_at_once_for_its_retry_after() {
        let t = Instant::now();
        for (after, open_for) in [
            (Some(Duration::from_secs(60)), Duration::from_secs(60)),
            // Shorter than the cooldown (10 s here): its own time.
            (Some(Duration::from_secs(2)), Duration::from_secs(2)),
            (None, RATE_LIMITED_FOR),
        ] {
            let b = breaker();
            let p = b.try_acquire(t).unwrap();
            b.record(p, Outcome::RateLimited(after), t);
            assert_eq!(b.try_acquire(t).err(), Some(t + open_for), "{after:?}");
        }
    }

    #[test]
    fn a_rate_limit_cannot_switch_a_provider_off_for_good() {
        let b = breaker();
        let t = Instant::now();
        let p = b.try_acquire(t).unwrap();
        b.record(
            p,
            Outcome::RateLimited(Some(Duration::from_secs(u64::MAX / 4))),
            t,
        );
        assert_eq!(b.try_acquire(t).err(), Some(t + MAX_RETRY_AFTER));
    }

    #[test]
    fn a_neutral_outcome_changes_nothing_but_frees_the_probe() {
        let b = breaker();
        let t = Instant::now();
        fail(&b, t);
        let p = b.try_acquire(t).unwrap();
        b.record(p, Outcome::Neutral, t);
        fail(&b, t);
        assert!(!b.is_open(), "still two failures, not three");
        fail(&b, t);
        let later = t + Duration::from_secs(10);
        let probe = b.try_acquire(later).unwrap();
        b.record(probe, Outcome::Neutral, later);
        assert!(b.try_acquire(later).unwrap().is_probe());
    }
}
