//! Prometheus metrics of the operator, served at `/metrics`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cro_runtime::gate::DenialCounts;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerOnly {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenialLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabels {
    capability: String,
}

type DenialSource = Arc<dyn Fn() -> Option<DenialCounts> + Send + Sync>;

/// The runtime's gate keeps the counts; they are read when Prometheus scrapes, so no
/// call path has to remember to copy them.
struct DenialCollector(DenialSource);

impl std::fmt::Debug for DenialCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DenialCollector")
    }
}

impl Collector for DenialCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(d) = (self.0)() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "provider_capability_denials",
            "Capability requests of the provider that its grants refused, by capability",
            None,
            MetricType::Counter,
        )?;
        for (capability, n) in [("http", d.http), ("secret", d.secret), ("lookup", d.lookup)] {
            let labels = CapabilityLabels {
                capability: capability.into(),
            };
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    provider: String,
    budget: String,
}

/// (provider name, budget label, times hit), read at scrape time from the runtime.
type BudgetSource = Arc<dyn Fn() -> Option<(String, Vec<(&'static str, u64)>)> + Send + Sync>;

/// The runtime counts the budgets a provider hit; like the denials, read when scraped.
struct BudgetCollector(BudgetSource);

impl std::fmt::Debug for BudgetCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BudgetCollector")
    }
}

impl Collector for BudgetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((provider, counts)) = (self.0)() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "provider_budget_exceeded",
            "Times a provider hit one of its sandbox budgets (memory, log, cluster reads, ...)",
            None,
            MetricType::Counter,
        )?;
        for (budget, n) in counts {
            let labels = BudgetLabels {
                provider: provider.clone(),
                budget: budget.into(),
            };
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~262 s: node commands and fabric calls span that range (a slow fabric
    // may take the 180 s the Go operator allowed one request).
    Histogram::new(exponential_buckets(0.001, 2.0, 19))
}

/// Registers `metric` and hands back the handle the operator updates (a clone shares
/// the values).
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoutedLabels {
    provider: String,
    outcome: String,
}

/// (provider name, calls, failed calls) of every provider the registry runs.
type RoutedSource = Box<dyn Fn() -> Vec<(String, u64, u64)> + Send + Sync>;

/// Calls per provider (crate::registry), read when scraped.
struct RoutedCollector(RoutedSource);

impl std::fmt::Debug for RoutedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoutedCollector")
    }
}

impl Collector for RoutedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = (self.0)();
        let mut family = encoder.encode_descriptor(
            "provider_routed_calls",
            "Provider calls by the provider (CdiProvider or the implicit one) that served them, ok or failed",
            None,
            MetricType::Counter,
        )?;
        for (provider, calls, failed) in counts {
            for (outcome, n) in [("ok", calls.saturating_sub(failed)), ("failed", failed)] {
                let labels = RoutedLabels {
                    provider: provider.clone(),
                    outcome: outcome.into(),
                };
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histograms<ControllerOnly>,
    provider_calls: Family<ProviderLabels, Counter>,
    provider_duration: Histograms<OperationLabels>,
    admission_reviews: Family<AdmissionLabels, Counter>,
    admission_denials: Family<DenialLabels, Counter>,
    orphans_tracked: Gauge,
    orphans_released: Counter,
    attach_adoptions: Counter,
    leader: Gauge,
    providers_held: Gauge,
    /// Set once: a scraper tells a restarted process from one that kept running.
    _start_time: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cro");
        let r = &mut registry;
        // Registered (and so listed at /metrics) in the order written here.
        Self {
            reconciles: registered(
                r,
                "reconciles",
                "Reconciliations by controller and outcome (ok, error)",
                Family::<ControllerLabels, Counter>::default(),
            ),
            reconcile_errors: registered(
                r,
                "reconcile_errors",
                "Failed reconciliations by controller and error kind",
                Family::<ErrorLabels, Counter>::default(),
            ),
            reconcile_duration: registered(
                r,
                "reconcile_duration_seconds",
                "Time spent in one reconciliation",
                Family::new_with_constructor(latency_histogram),
            ),
            provider_calls: registered(
                r,
                "provider_calls",
                "Provider calls by operation and outcome (ok, in_progress, or the error kind)",
                Family::<ProviderLabels, Counter>::default(),
            ),
            provider_duration: registered(
                r,
                "provider_call_duration_seconds",
                "Latency of provider calls by operation",
                Family::new_with_constructor(latency_histogram),
            ),
            admission_reviews: registered(
                r,
                "admission_reviews",
                "ComposabilityRequest admission reviews by outcome (allowed, denied, invalid)",
                Family::<AdmissionLabels, Counter>::default(),
            ),
            admission_denials: registered(
                r,
                "admission_denials",
                "ComposabilityRequests refused by the webhook, by rule",
                Family::<DenialLabels, Counter>::default(),
            ),
            orphans_tracked: registered(
                r,
                "orphan_devices",
                "Devices the fabric reports that no ComposableResource holds",
                Gauge::default(),
            ),
            orphans_released: registered(
                r,
                "orphan_devices_released",
                "Ready-to-detach ComposableResources created for orphaned devices",
                Counter::default(),
            ),
            attach_adoptions: registered(
                r,
                "attach_adoptions",
                "Devices adopted by an attach whose earlier reply was lost, instead of asking the fabric again",
                Counter::default(),
            ),
            leader: registered(
                r,
                "leader",
                "1 while this instance holds the leader Lease",
                Gauge::default(),
            ),
            providers_held: registered(
                r,
                "providers_held",
                "Providers whose work this replica does now (their Leases held; all of them without leader election)",
                Gauge::default(),
            ),
            _start_time: {
                let gauge = registered(
                    r,
                    "process_start_time_seconds",
                    "When this process started, in seconds since the Unix epoch (a restart changes it)",
                    Gauge::<f64, std::sync::atomic::AtomicU64>::default(),
                );
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                gauge.set(now.as_secs_f64());
                gauge
            },
            registry: Mutex::new(registry),
        }
    }

    pub(crate) fn reconciled(&self, controller: &str, error_kind: Option<&str>, took: Duration) {
        let outcome = if error_kind.is_some() { "error" } else { "ok" };
        self.reconciles
            .get_or_create(&ControllerLabels {
                controller: controller.into(),
                outcome: outcome.into(),
            })
            .inc();
        if let Some(kind) = error_kind {
            self.reconcile_errors
                .get_or_create(&ErrorLabels {
                    controller: controller.into(),
                    kind: kind.into(),
                })
                .inc();
        }
        self.reconcile_duration
            .get_or_create(&ControllerOnly {
                controller: controller.into(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn provider_call(&self, operation: &str, outcome: &str, took: Duration) {
        self.provider_calls
            .get_or_create(&ProviderLabels {
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.provider_duration
            .get_or_create(&OperationLabels {
                operation: operation.into(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn admission(&self, outcome: &str, denial_reason: Option<&str>) {
        self.admission_reviews
            .get_or_create(&AdmissionLabels {
                outcome: outcome.into(),
            })
            .inc();
        if let Some(reason) = denial_reason {
            self.admission_denials
                .get_or_create(&DenialLabels {
                    reason: reason.into(),
                })
                .inc();
        }
    }

    pub(crate) fn set_orphans(&self, n: usize) {
        self.orphans_tracked
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn orphan_released(&self) {
        self.orphans_released.inc();
    }

    pub(crate) fn attach_adopted(&self) {
        self.attach_adoptions.inc();
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub(crate) fn set_providers_held(&self, held: usize) {
        self.providers_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Exports the capability denials `source` counts (the provider's gate).
    pub(crate) fn watch_denials(
        &self,
        source: impl Fn() -> Option<DenialCounts> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .register_collector(Box::new(DenialCollector(Arc::new(source))));
    }

    /// Exports `cro_provider_budget_exceeded_total{provider,budget}` from `source` (the
    /// runtime's per-provider budget counters).
    pub(crate) fn watch_budgets(
        &self,
        source: impl Fn() -> Option<(String, Vec<(&'static str, u64)>)> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .register_collector(Box::new(BudgetCollector(Arc::new(source))));
    }

    /// Exports `cro_provider_routed_calls_total{provider,outcome}` from `source`.
    pub(crate) fn watch_routed_calls(
        &self,
        source: impl Fn() -> Vec<(String, u64, u64)> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .register_collector(Box::new(RoutedCollector(Box::new(source))));
    }

    /// Exports how many warnings the provider logged (`source` reads its count), e.g. a
    /// node the FTI provider left out of a device listing (docs/fti-fabric-api.md).
    pub(crate) fn watch_provider_warnings(
        &self,
        source: impl Fn() -> Option<u64> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .register_collector(Box::new(WarningCollector(Arc::new(source))));
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// The provider's count of logged warnings, read at scrape time.
struct WarningCollector(Arc<dyn Fn() -> Option<u64> + Send + Sync>);

impl std::fmt::Debug for WarningCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WarningCollector")
    }
}

impl Collector for WarningCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(n) = (self.0)() else {
            return Ok(());
        };
        let metric = encoder.encode_descriptor(
            "provider_warnings",
            "Warnings and errors the provider logged (e.g. a node left out of a device listing)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(n).encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_warnings_are_read_at_scrape_time() {
        let m = Metrics::new();
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let source = n.clone();
        m.watch_provider_warnings(move || Some(source.load(std::sync::atomic::Ordering::SeqCst)));
        assert!(m.encode().contains("cro_provider_warnings_total 0"));
        n.store(2, std::sync::atomic::Ordering::SeqCst);
        let text = m.encode();
        assert!(text.contains("cro_provider_warnings_total 2"), "{text}");
    }

    #[test]
    fn capability_denials_are_read_at_scrape_time() {
        let m = Metrics::new();
        let counts = Arc::new(Mutex::new(DenialCounts::default()));
        let source = counts.clone();
        m.watch_denials(move || Some(*source.lock().unwrap()));
        assert!(
            m.encode()
                .contains("cro_provider_capability_denials_total{capability=\"http\"} 0")
        );
        counts.lock().unwrap().http = 3;
        counts.lock().unwrap().lookup = 1;
        let text = m.encode();
        assert!(
            text.contains("cro_provider_capability_denials_total{capability=\"http\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("cro_provider_capability_denials_total{capability=\"lookup\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE cro_provider_capability_denials counter"),
            "{text}"
        );
    }

    #[test]
    fn budgets_hit_are_read_at_scrape_time() {
        let m = Metrics::new();
        let hits = Arc::new(Mutex::new(0u64));
        let source = hits.clone();
        m.watch_budgets(move || {
            Some((
                "fti".to_string(),
                vec![("log_lines", *source.lock().unwrap()), ("memory", 0)],
            ))
        });
        *hits.lock().unwrap() = 2;
        let text = m.encode();
        assert!(
            text.contains(
                "cro_provider_budget_exceeded_total{provider=\"fti\",budget=\"log_lines\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "cro_provider_budget_exceeded_total{provider=\"fti\",budget=\"memory\"} 0"
            ),
            "{text}"
        );
    }

    #[test]
    fn metrics_show_in_the_exposition() {
        let m = Metrics::new();
        m.reconciled("resource", None, Duration::from_millis(3));
        m.reconciled("resource", Some("provider"), Duration::from_millis(3));
        m.provider_call("add_resource", "in_progress", Duration::from_millis(20));
        m.admission("denied", Some("duplicate_samenode"));
        m.set_leader(true);
        m.set_providers_held(2);
        let text = m.encode();
        for line in [
            "cro_reconciles_total{controller=\"resource\",outcome=\"ok\"} 1",
            "cro_reconciles_total{controller=\"resource\",outcome=\"error\"} 1",
            "cro_reconcile_errors_total{controller=\"resource\",kind=\"provider\"} 1",
            "cro_provider_calls_total{operation=\"add_resource\",outcome=\"in_progress\"} 1",
            "cro_provider_call_duration_seconds_count{operation=\"add_resource\"} 1",
            "cro_admission_denials_total{reason=\"duplicate_samenode\"} 1",
            "cro_leader 1",
            "cro_providers_held 2",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        let started: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("cro_process_start_time_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no start time in\n{text}"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - 60.0..=now).contains(&started), "{started} vs {now}");
        assert!(text.ends_with("# EOF\n"));
    }
}
