//! Every flag of kube-controller-manager and cloud-controller-manager that an operator may pass to
//! a process running the node IPAM controller, and what this controller does with it.
//!
//! Sources (flag names, value types): kube-controller-manager's `cmd/kube-controller-manager/app/
//! options/*.go` (each controller's `AddFlags`), and the shared option packages it and every
//! cloud-controller-manager register — `k8s.io/controller-manager/options` (generic, debugging),
//! `k8s.io/controller-manager/pkg/leadermigration/options`, `k8s.io/cloud-provider/options`
//! (kube-cloud-shared, cloud provider, service, node and webhook controllers),
//! `k8s.io/apiserver/pkg/server/options` (secure serving, delegating authentication and
//! authorization), `k8s.io/component-base/{logs,metrics,featuregate,cli/globalflag}` — as vendored
//! at v0.36.3 by cloud-provider-azure, whose own cloud-controller-manager adds
//! `cmd/cloud-controller-manager/app/options/{options,dynamic,nodeipamcontroller}.go`. Flags that
//! kube-controller-manager has since removed (`--pod-eviction-timeout`, `--enable-taint-manager`,
//! insecure serving's `--port`/`--address`, klog's file flags, …) are accepted too, so that an older
//! manifest still starts.
//!
//! [`KCM_FLAGS`] is the one table: [`super::command`] adds every flag that is not implemented as a
//! hidden, accepted argument; the README's flag table is rendered from it
//! ([`markdown_table`], checked by a test). This controller's own flags, which no kcm or ccm has
//! (the node-pool flags of `CloudAllocator`, the workers, the metrics and health addresses), are
//! rows of the same table with the source [`Source::Ours`], so that it lists every flag the
//! command line takes.

use clap::{Arg, ArgAction, ArgMatches};

/// What a flag takes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// A pflag boolean: `--flag` or `--flag=BOOL`.
    Bool,
    /// A value: `--flag VALUE` or `--flag=VALUE` (repeatable; list flags append).
    Value,
}

/// Which component registers the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// kube-controller-manager only.
    Kcm,
    /// Both kube-controller-manager and cloud-controller-manager (the shared option packages).
    Both,
    /// cloud-controller-manager (`k8s.io/cloud-provider`) only.
    Ccm,
    /// cloud-provider-azure's cloud-controller-manager only.
    AzureCcm,
    /// Removed from current kube-controller-manager; still found in older manifests.
    KcmRemoved,
    /// This controller's own flag: neither kube-controller-manager nor any
    /// cloud-controller-manager has it.
    Ours,
}

impl Source {
    /// Short text for the README table.
    pub fn label(self) -> &'static str {
        match self {
            Source::Kcm => "kcm",
            Source::Both => "kcm, ccm",
            Source::Ccm => "ccm",
            Source::AzureCcm => "azure ccm",
            Source::KcmRemoved => "kcm (removed)",
            Source::Ours => "ours",
        }
    }
}

/// What this controller does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Implemented (a real argument of [`super::Cli`]); the text says how.
    Implemented(&'static str),
    /// Accepted, listed once at start-up as ignored, with this reason.
    Ignored(&'static str),
}

/// One kube-controller-manager / cloud-controller-manager flag (or one of ours, [`Source::Ours`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KcmFlag {
    /// Long name without `--`.
    pub name: &'static str,
    /// Boolean or value.
    pub takes: Takes,
    /// Who registers it.
    pub source: Source,
    /// What happens here.
    pub handling: Handling,
}

const OTHER_CONTROLLER: &str = "configures a controller this process does not run";
const CLOUD: &str =
    "this controller uses no cloud provider (CloudAllocator's sizes come from the Nodes' labels)";
const CLIENT_CERT_AUTH: &str = "the secure port authenticates bearer tokens only (TokenReview); client-certificate and front-proxy request-header authentication are not supported, so the `extension-apiserver-authentication` ConfigMap is not read";
const REVIEW_CACHE: &str =
    "the secure port caches TokenReview and SubjectAccessReview answers for kcm's default, 10 s";
const TLS_DEFAULTS: &str = "the secure port uses rustls's defaults: TLS 1.2 and 1.3 with their safe cipher suites and key-exchange groups";
const HTTP1_ONLY: &str = "the secure port serves HTTP/1.1 only";
const METRICS: &str = "this controller's metric set is fixed (see README, Metrics)";
const LOG_STREAM: &str = "every log line goes to stderr, unbuffered";
const PROFILING: &str = "no /debug/pprof endpoint is served";
const KLOG_REMOVED: &str =
    "klog flag removed from kube-controller-manager in 1.26; logs go to stderr";

use Handling::{Ignored, Implemented};
use Source::{AzureCcm, Both, Ccm, Kcm, KcmRemoved, Ours};
use Takes::{Bool, Value};

const fn flag(name: &'static str, takes: Takes, source: Source, handling: Handling) -> KcmFlag {
    KcmFlag {
        name,
        takes,
        source,
        handling,
    }
}

/// Every kube-controller-manager and cloud-controller-manager flag, and this controller's own
/// ([`Source::Ours`]), sorted by name.
pub const KCM_FLAGS: &[KcmFlag] = &[
    flag("add-dir-header", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "address",
        Value,
        KcmRemoved,
        Ignored("insecure serving was removed from kube-controller-manager in 1.24"),
    ),
    flag(
        "allocate-node-cidrs",
        Bool,
        Both,
        Implemented(
            "as kcm; default true here (kcm: false), `false` runs without allocating and `plan` refuses it",
        ),
    ),
    flag("allow-metric-labels", Value, Both, Ignored(METRICS)),
    flag(
        "allow-metric-labels-manifest",
        Value,
        Both,
        Ignored(METRICS),
    ),
    flag(
        "allow-node-mask-label",
        Bool,
        Ours,
        Implemented(
            "with `--cidr-allocator-type=CloudAllocator`: the Nodes' `nodeipam.io/node-cidr-mask-size-ipv4`/`-ipv6` labels size their blocks, before the rules, within `--node-mask-label-range` (see README, Node pools)",
        ),
    ),
    flag("allow-untagged-cloud", Bool, Both, Ignored(CLOUD)),
    flag("alsologtostderr", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "attach-detach-reconcile-sync-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "authentication-kubeconfig",
        Value,
        Both,
        Implemented(
            "as kcm: the kubeconfig of the API server that answers the secure port's TokenReviews (default: the controller's own client)",
        ),
    ),
    flag(
        "authentication-skip-lookup",
        Bool,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "authentication-token-webhook-cache-ttl",
        Value,
        Both,
        Ignored(REVIEW_CACHE),
    ),
    flag(
        "authentication-tolerate-lookup-failure",
        Bool,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "authorization-always-allow-paths",
        Value,
        Both,
        Implemented(
            "as kcm: paths the secure port serves without a token (default `/healthz,/readyz,/livez`; a trailing `*` matches a prefix)",
        ),
    ),
    flag(
        "authorization-kubeconfig",
        Value,
        Both,
        Implemented(
            "as kcm: the kubeconfig of the API server that answers the secure port's SubjectAccessReviews (default: the controller's own client)",
        ),
    ),
    flag(
        "authorization-webhook-cache-authorized-ttl",
        Value,
        Both,
        Ignored(REVIEW_CACHE),
    ),
    flag(
        "authorization-webhook-cache-unauthorized-ttl",
        Value,
        Both,
        Ignored(REVIEW_CACHE),
    ),
    flag(
        "bind-address",
        Value,
        Both,
        Implemented(
            "as kcm: the IP the secure port listens on (default `0.0.0.0`; empty or unspecified listens on every interface)",
        ),
    ),
    flag(
        "cert-dir",
        Value,
        Both,
        Ignored(
            "without `--tls-cert-file` the self-signed certificate is kept in memory, never written to a directory",
        ),
    ),
    // kcm's `CloudAllocator` "uses cloud platform support to do node CIDR range allocations"
    // (`pkg/controller/nodeipam/ipam/cidr_allocator.go`); ours is cloud-provider-azure's.
    flag(
        "cidr-allocator-type",
        Value,
        Both,
        Implemented(
            "`RangeAllocator` (the default: every Node gets the node CIDR mask size) or `CloudAllocator` (per-Node sizes from `--node-cidr-mask-size-rule` and the mask labels, as cloud-provider-azure's allocator sizes its node pools; kcm's `CloudAllocator` takes the ranges from the cloud instead); any other type exits 2",
        ),
    ),
    flag("client-ca-file", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("cloud-config", Value, Both, Ignored(CLOUD)),
    flag("cloud-config-key", Value, AzureCcm, Ignored(CLOUD)),
    flag("cloud-config-secret-name", Value, AzureCcm, Ignored(CLOUD)),
    flag(
        "cloud-config-secret-namespace",
        Value,
        AzureCcm,
        Ignored(CLOUD),
    ),
    flag("cloud-provider", Value, Both, Ignored(CLOUD)),
    flag("cluster-cidr", Value, Both, Implemented("as kcm")),
    flag(
        "cluster-name",
        Value,
        Both,
        Ignored("names cloud resources; this controller does not use it"),
    ),
    flag(
        "cluster-signing-cert-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-duration",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kube-apiserver-client-cert-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kube-apiserver-client-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kubelet-client-cert-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kubelet-client-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kubelet-serving-cert-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-kubelet-serving-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-legacy-unknown-cert-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "cluster-signing-legacy-unknown-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-cron-job-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-daemonset-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-deployment-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-device-taint-eviction-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-endpoint-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-ephemeralvolume-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-eviction-request-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("concurrent-gc-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag(
        "concurrent-horizontal-pod-autoscaler-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-job-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-leader-election-lease-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-namespace-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-node-status-updates",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-node-syncs",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("concurrent-rc-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag(
        "concurrent-replicaset-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-resource-quota-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-resourceclaim-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-service-endpoint-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-service-syncs",
        Value,
        Both,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-serviceaccount-token-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-statefulset-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-ttl-after-finished-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "concurrent-validating-admission-policy-status-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "configure-cloud-routes",
        Bool,
        Both,
        Ignored("routes are the route controller's job, not run here"),
    ),
    flag("contention-profiling", Bool, Both, Ignored(PROFILING)),
    flag(
        "controller-start-interval",
        Value,
        Both,
        Ignored("this process starts one controller"),
    ),
    flag(
        "controllers",
        Value,
        Both,
        Implemented(
            "read as kcm does (`*`, `name`, `-name`; first match wins; the node IPAM controller is `nodeipam`/`node-ipam-controller` in kcm and `node-ipam` in cloud-provider-azure's ccm); a list that disables it exits 2, since this process is that controller; other names are not checked",
        ),
    ),
    flag(
        "deployment-controller-sync-period",
        Value,
        KcmRemoved,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "disable-attach-detach-reconcile-sync",
        Bool,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "disable-force-detach-on-timeout",
        Bool,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("disable-http2-serving", Bool, Both, Ignored(HTTP1_ONLY)),
    flag("disabled-metrics", Value, Both, Ignored(METRICS)),
    flag(
        "enable-dynamic-provisioning",
        Bool,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("enable-dynamic-reloading", Bool, AzureCcm, Ignored(CLOUD)),
    flag(
        "enable-garbage-collector",
        Bool,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "enable-hostpath-provisioner",
        Bool,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "enable-leader-migration",
        Bool,
        Both,
        Ignored(
            "leader migration hands controllers between kcm and ccm under one Lease; this controller always takes its own Lease (--leader-elect-resource-name)",
        ),
    ),
    flag(
        "enable-taint-manager",
        Bool,
        KcmRemoved,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "endpoint-updates-batch-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "endpointslice-updates-batch-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "experimental-cluster-signing-duration",
        Value,
        KcmRemoved,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("external-cloud-volume-plugin", Value, Both, Ignored(CLOUD)),
    flag(
        "feature-gates",
        Value,
        Both,
        Ignored("no kube-controller-manager feature gate changes this controller's allocation"),
    ),
    flag(
        "flex-volume-plugin-dir",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "health-probe-bind-address",
        Value,
        Ours,
        Implemented(
            "`/healthz`, `/livez` and `/readyz` over plain HTTP, for local use (default `0.0.0.0:8081`; `0` turns it off); in a cluster, probe `--secure-port`",
        ),
    ),
    flag(
        "horizontal-pod-autoscaler-cpu-initialization-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "horizontal-pod-autoscaler-downscale-stabilization",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "horizontal-pod-autoscaler-initial-readiness-delay",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "horizontal-pod-autoscaler-sync-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "horizontal-pod-autoscaler-tolerance",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "http2-max-streams-per-connection",
        Value,
        Both,
        Ignored(HTTP1_ONLY),
    ),
    flag(
        "kube-api-burst",
        Value,
        Both,
        Implemented("as kcm (default 30), for this controller's writes (token bucket)"),
    ),
    flag(
        "kube-api-content-type",
        Value,
        Both,
        Ignored("requests are sent as JSON"),
    ),
    flag(
        "kube-api-qps",
        Value,
        Both,
        Implemented("as kcm (default 20), for this controller's writes (token bucket)"),
    ),
    flag(
        "kubeconfig",
        Value,
        Both,
        Implemented("as kcm (`clientcmd.BuildConfigFromFlags`)"),
    ),
    flag(
        "large-cluster-size-threshold",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "leader-elect",
        Bool,
        Both,
        Implemented("as kcm (default true)"),
    ),
    flag(
        "leader-elect-lease-duration",
        Value,
        Both,
        Implemented("as kcm (15s)"),
    ),
    flag(
        "leader-elect-renew-deadline",
        Value,
        Both,
        Implemented("as kcm (10s)"),
    ),
    flag(
        "leader-elect-resource-lock",
        Value,
        Both,
        Implemented(
            "`leases` (the default) only, as kcm: another lock with --leader-elect exits 2",
        ),
    ),
    flag(
        "leader-elect-resource-name",
        Value,
        Both,
        Implemented(
            "default `nodeipam-controller` (kcm: `kube-controller-manager`); kcm's or ccm's own Lease name exits 2: sharing it would make this controller and kcm exclude each other",
        ),
    ),
    flag(
        "leader-elect-resource-namespace",
        Value,
        Both,
        Implemented("as kcm (kube-system)"),
    ),
    flag(
        "leader-elect-retry-period",
        Value,
        Both,
        Implemented("as kcm (2s)"),
    ),
    flag(
        "leader-migration-config",
        Value,
        Both,
        Ignored("see --enable-leader-migration"),
    ),
    flag(
        "legacy-service-account-token-clean-up-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("log-backtrace-at", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-dir", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-file", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "log-file-max-size",
        Value,
        KcmRemoved,
        Ignored(KLOG_REMOVED),
    ),
    flag("log-flush-frequency", Value, Both, Ignored(LOG_STREAM)),
    flag(
        "log-format",
        Value,
        AzureCcm,
        Implemented("alias of --logging-format (cloud-provider-azure's name)"),
    ),
    flag(
        "log-json-info-buffer-size",
        Value,
        Both,
        Ignored(LOG_STREAM),
    ),
    flag("log-json-split-stream", Bool, Both, Ignored(LOG_STREAM)),
    flag(
        "log-text-info-buffer-size",
        Value,
        Both,
        Ignored(LOG_STREAM),
    ),
    flag("log-text-split-stream", Bool, Both, Ignored(LOG_STREAM)),
    flag(
        "logging-format",
        Value,
        Kcm,
        Implemented(
            "`text` (default) or `json`: JSON lines with klog's field names (`ts`, `caller`, `msg`, `v`, structured keys)",
        ),
    ),
    flag("logtostderr", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "master",
        Value,
        Both,
        Implemented("as kcm (`clientcmd.BuildConfigFromFlags`): alone, no credentials are sent"),
    ),
    flag(
        "max-endpoints-per-slice",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "metrics-bind-address",
        Value,
        Ours,
        Implemented(
            "Prometheus `/metrics` over plain HTTP **without authentication**, for local use (default `0.0.0.0:8080`; `0` turns it off); in a cluster, scrape the authenticated `--secure-port`, as kcm serves its metrics",
        ),
    ),
    flag(
        "min-resync-period",
        Value,
        Both,
        Ignored("the informer watches every Node change and never resyncs"),
    ),
    flag(
        "mirroring-concurrent-service-endpoint-syncs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "mirroring-endpointslice-updates-batch-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "mirroring-max-endpoints-per-subset",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "namespace-sync-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("node-cidr-mask-size", Value, Both, Implemented("as kcm")),
    flag(
        "node-cidr-mask-size-ipv4",
        Value,
        Both,
        Implemented("as kcm"),
    ),
    flag(
        "node-cidr-mask-size-ipv6",
        Value,
        Both,
        Implemented("as kcm"),
    ),
    flag(
        "node-cidr-mask-size-rule",
        Value,
        Ours,
        Implemented(
            "with `--cidr-allocator-type=CloudAllocator`, repeatable: `KEY=VALUE:ipv4=N,ipv6=M` gives the Nodes whose label KEY equals VALUE /N and /M blocks; the first matching rule wins (see README, Node pools)",
        ),
    ),
    flag(
        "node-cidr-mask-size-rules-file",
        Value,
        Ours,
        Implemented(
            "with `--cidr-allocator-type=CloudAllocator`: more rules in `--node-cidr-mask-size-rule`'s syntax, one per line, after the flags' rules",
        ),
    ),
    flag(
        "node-cidr-update-workers",
        Value,
        Ours,
        Implemented(
            "concurrent writes of spec.podCIDR(s) (default 30, the number of `cidrUpdateWorkers` kcm's range allocator runs)",
        ),
    ),
    flag("node-eviction-rate", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag(
        "node-filter-requirements",
        Value,
        AzureCcm,
        Implemented(
            "empty only: a selector would make cloud-provider-azure's node IPAM controller serve only the matching Nodes, which this controller does not do, so a non-empty one exits 2",
        ),
    ),
    flag(
        "node-mask-label-range",
        Value,
        Ours,
        Implemented(
            "with `--allow-node-mask-label`: `ipv4=MIN-MAX,ipv6=MIN-MAX`, the sizes a mask label may ask for (default: the coarsest to the finest size the default and the rules give)",
        ),
    ),
    flag(
        "node-monitor-grace-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "node-monitor-period",
        Value,
        Both,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "node-selector",
        Value,
        Ours,
        Implemented(
            "serve only the Nodes this label selector selects (`a=b,c!=d,e in (x,y),!f`; default every Node); the others are never written, and the podCIDRs they have stay occupied (see README, Serving some Nodes)",
        ),
    ),
    flag(
        "node-startup-grace-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "node-status-update-frequency",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "node-sync-period",
        Value,
        Both,
        Ignored("deprecated no-op upstream"),
    ),
    flag("one-output", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "permit-address-sharing",
        Bool,
        Both,
        Ignored(
            "the secure port's listener (tokio) always sets SO_REUSEADDR, as this flag does in kcm",
        ),
    ),
    flag(
        "permit-port-sharing",
        Bool,
        Both,
        Ignored("SO_REUSEPORT is never set: one process owns the secure port"),
    ),
    flag(
        "pod-eviction-timeout",
        Value,
        KcmRemoved,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "port",
        Value,
        KcmRemoved,
        Ignored("insecure serving was removed from kube-controller-manager in 1.24"),
    ),
    flag("profiling", Bool, Both, Ignored(PROFILING)),
    flag(
        "pv-recycler-increment-timeout-nfs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pv-recycler-minimum-timeout-hostpath",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pv-recycler-minimum-timeout-nfs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pv-recycler-pod-template-filepath-hostpath",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pv-recycler-pod-template-filepath-nfs",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pv-recycler-timeout-increment-hostpath",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "pvclaimbinder-sync-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "requestheader-allowed-names",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "requestheader-client-ca-file",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "requestheader-extra-headers-prefix",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "requestheader-group-headers",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "requestheader-uid-headers",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "requestheader-username-headers",
        Value,
        Both,
        Ignored(CLIENT_CERT_AUTH),
    ),
    flag(
        "resource-quota-sync-period",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("root-ca-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag(
        "route-reconciliation-period",
        Value,
        Both,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "secondary-node-eviction-rate",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "secure-port",
        Value,
        Both,
        Implemented(
            "as kcm: HTTPS for `/healthz`, `/livez`, `/readyz` and `/metrics` with delegated authentication (TokenReview) and authorization (SubjectAccessReview), answers cached 10 s (default 10257; `0` turns it off; see docs/operations.md)",
        ),
    ),
    flag(
        "service-account-private-key-file",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "service-cluster-ip-range",
        Value,
        Both,
        Implemented("as kcm: node blocks that overlap it are never allocated"),
    ),
    flag(
        "show-hidden-metrics-for-version",
        Value,
        Both,
        Ignored(METRICS),
    ),
    flag("skip-headers", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("skip-log-headers", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("stderrthreshold", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag(
        "terminated-pod-gc-threshold",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "tls-cert-file",
        Value,
        Both,
        Implemented(
            "as kcm: the PEM serving certificate (and intermediates), re-read every minute; without it and `--tls-private-key-file`, a self-signed certificate for `localhost` is generated in memory",
        ),
    ),
    flag("tls-cipher-suites", Value, Both, Ignored(TLS_DEFAULTS)),
    flag("tls-curve-preferences", Value, Both, Ignored(TLS_DEFAULTS)),
    flag("tls-min-version", Value, Both, Ignored(TLS_DEFAULTS)),
    flag(
        "tls-private-key-file",
        Value,
        Both,
        Implemented("as kcm: the PEM private key of `--tls-cert-file` (give both or neither)"),
    ),
    flag(
        "tls-sni-cert-key",
        Value,
        Both,
        Ignored(
            "the secure port serves one certificate (`--tls-cert-file` or the self-signed one) whatever the SNI name",
        ),
    ),
    flag(
        "unhealthy-zone-threshold",
        Value,
        Kcm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "use-service-account-credentials",
        Bool,
        Both,
        Ignored(
            "requests use the --kubeconfig (or in-cluster) credentials; kcm's node IPAM controller would use the kube-system/node-controller service account: grant this controller's identity the RBAC in README",
        ),
    ),
    flag(
        "v",
        Value,
        Both,
        Implemented("klog verbosity (`-v N`, `--v=N`), mapped onto log levels (see README, Logs)"),
    ),
    flag(
        "vmodule",
        Value,
        Both,
        Ignored("per-module levels are set with RUST_LOG"),
    ),
    flag(
        "webhook-bind-address",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("webhook-cert-dir", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag(
        "webhook-disable-http2-serving",
        Bool,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("webhook-secure-port", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag(
        "webhook-tls-cert-file",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "webhook-tls-cipher-suites",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "webhook-tls-curve-preferences",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "webhook-tls-min-version",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "webhook-tls-private-key-file",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag(
        "webhook-tls-sni-cert-key",
        Value,
        Ccm,
        Ignored(OTHER_CONTROLLER),
    ),
    flag("webhooks", Value, Ccm, Ignored(OTHER_CONTROLLER)),
];

/// The flag's entry, if it is a kcm/ccm flag.
pub fn lookup(name: &str) -> Option<&'static KcmFlag> {
    KCM_FLAGS.iter().find(|f| f.name == name)
}

/// Why an accepted flag is ignored (`None` for implemented ones).
pub fn ignored_reason(flag: &KcmFlag) -> Option<&'static str> {
    match flag.handling {
        Implemented(_) => None,
        Ignored(reason) => Some(reason),
    }
}

/// The hidden clap arguments for every flag that is accepted but not implemented. Booleans take
/// pflag's forms ([`super::pflag::parse_bool`]); values are kept as text. Every one is global, so
/// `plan` accepts the same command line.
pub fn ignored_args() -> impl Iterator<Item = Arg> {
    KCM_FLAGS
        .iter()
        .filter(|f| ignored_reason(f).is_some())
        .map(|f| {
            let arg = Arg::new(f.name)
                .long(f.name)
                .hide(true)
                .global(true)
                .action(ArgAction::Append);
            match f.takes {
                Bool => arg
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_parser(|text: &str| {
                        super::pflag::parse_bool(text).map(|_| text.to_owned())
                    }),
                Value => arg.num_args(1).allow_hyphen_values(true),
            }
        })
}

/// An ignored flag as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenIgnoredFlag {
    /// Long name without `--`.
    pub name: &'static str,
    /// The values given, in order (a boolean given alone reads `true`).
    pub values: Vec<String>,
    /// Why it is ignored.
    pub reason: &'static str,
}

/// The ignored flags whose pflag type collects repeated values (`stringSlice`, `mapStringBool`,
/// `stringToString`, `namedCertKey`, `int32Slice`); every other flag keeps its last value.
const LIST_FLAGS: [&str; 13] = [
    "allow-metric-labels",
    "disabled-metrics",
    "feature-gates",
    "requestheader-allowed-names",
    "requestheader-extra-headers-prefix",
    "requestheader-group-headers",
    "requestheader-uid-headers",
    "requestheader-username-headers",
    "tls-cipher-suites",
    "tls-curve-preferences",
    "tls-sni-cert-key",
    "webhooks",
    "webhook-tls-cipher-suites",
];

impl std::fmt::Display for GivenIgnoredFlag {
    /// `--name=value` as pflag reads it: the last value of a scalar flag (the last one wins), all
    /// values comma-joined for a list flag.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if LIST_FLAGS.contains(&self.name) {
            write!(f, "--{}={}", self.name, self.values.join(","))
        } else {
            write!(
                f,
                "--{}={}",
                self.name,
                self.values.last().map_or("", String::as_str)
            )
        }
    }
}

/// The ignored flags present in `matches`, in table order.
pub fn given_ignored(matches: &ArgMatches) -> Vec<GivenIgnoredFlag> {
    KCM_FLAGS
        .iter()
        .filter_map(|f| {
            let reason = ignored_reason(f)?;
            let values: Vec<String> = matches
                .try_get_many::<String>(f.name)
                .ok()
                .flatten()?
                .cloned()
                .collect();
            Some(GivenIgnoredFlag {
                name: f.name,
                values,
                reason,
            })
        })
        .collect()
}

/// Names under which kube-controller-manager and cloud-controller-manager know the node IPAM
/// controller in `--controllers`: kcm's canonical `node-ipam-controller` and its alias `nodeipam`
/// (`cmd/kube-controller-manager/names`), and cloud-provider-azure's `node-ipam`
/// (`cmd/cloud-controller-manager/app/controllermanager.go`).
pub const NODE_IPAM_CONTROLLER_NAMES: [&str; 3] = ["nodeipam", "node-ipam-controller", "node-ipam"];

/// Whether `--controllers` enables the node IPAM controller, by the rule of
/// `k8s.io/controller-manager/app.IsControllerEnabled`: the first entry naming it decides (`name`
/// on, `-name` off); without one, `*` enables it (it is on by default), and a list without `*`
/// enables nothing. `entries` are the comma-separated items of every `--controllers` given.
pub fn node_ipam_enabled<S: AsRef<str>>(entries: &[S]) -> bool {
    let mut star = false;
    for entry in entries {
        let entry = entry.as_ref();
        if NODE_IPAM_CONTROLLER_NAMES.contains(&entry) {
            return true;
        }
        if let Some(name) = entry.strip_prefix('-')
            && NODE_IPAM_CONTROLLER_NAMES.contains(&name)
        {
            return false;
        }
        star |= entry == "*";
    }
    star
}

/// The README table of every flag (markdown), rendered from [`KCM_FLAGS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| flag | from | here |\n|---|---|---|\n");
    for f in KCM_FLAGS {
        let name = if f.name == "v" {
            "`-v`, `--v`".to_owned()
        } else {
            format!("`--{}`", f.name)
        };
        let here = match f.handling {
            Implemented(how) => format!("**implemented**: {how}"),
            Ignored(reason) => format!("ignored: {reason}"),
        };
        out.push_str(&format!("| {name} | {} | {here} |\n", f.source.label()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_ignored_flags_display_as_pflag_reads_them() {
        let flag = |name: &'static str, values: &[&str]| GivenIgnoredFlag {
            name,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            reason: "",
        };
        assert_eq!(
            flag("profiling", &["true", "false"]).to_string(),
            "--profiling=false"
        );
        assert_eq!(
            flag("cluster-name", &["a", "b"]).to_string(),
            "--cluster-name=b"
        );
        assert_eq!(
            flag("feature-gates", &["A=true", "B=false"]).to_string(),
            "--feature-gates=A=true,B=false"
        );
        for name in LIST_FLAGS {
            assert!(lookup(name).is_some_and(|f| f.takes == Value), "{name}");
        }
    }

    #[test]
    fn table_is_sorted_and_unique() {
        for pair in KCM_FLAGS.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} / {}",
                pair[0].name,
                pair[1].name
            );
        }
    }

    /// kcm's rule (`IsControllerEnabled`), including kubeadm's `*,bootstrapsigner,tokencleaner` and
    /// the README's own `*,-nodeipam`.
    #[test]
    fn node_ipam_enabled_as_is_controller_enabled() {
        let cases: [(&[&str], bool); 10] = [
            (&["*"], true),
            (&["*", "bootstrapsigner", "tokencleaner"], true),
            (&["*", "-nodeipam"], false),
            (&["*", "-node-ipam-controller"], false),
            (&["*", "-cloud-node"], true),
            (&["*", "-node-ipam"], false),
            (&["-nodeipam", "nodeipam"], false),
            (&["nodeipam", "-nodeipam"], true),
            (&["route", "service"], false),
            (&[], false),
        ];
        for (entries, want) in cases {
            assert_eq!(node_ipam_enabled(entries), want, "{entries:?}");
        }
    }
}
