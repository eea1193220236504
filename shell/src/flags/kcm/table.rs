//! The table itself: every kube-controller-manager and cloud-controller-manager flag, and this
//! controller's own, one row each (name, what it takes, who registers it, what happens here),
//! sorted by name — see [`super`] for the sources and the readers of the table. Rows are kept one
//! per line (rustfmt would spread each over five); a long reason continues on the next line.

use super::Handling::{Ignored, Implemented};
use super::Source::{AzureCcm, Both, Ccm, Kcm, KcmRemoved, Ours};
use super::Takes::{Bool, Value};
use super::{Handling, KcmFlag, Source, Takes};

const OTHER_CONTROLLER: &str = "configures a controller this process does not run";
const CLOUD: &str =
    "this controller uses no cloud provider (CloudAllocator's sizes come from the Nodes' labels)";
const CLIENT_CERT_AUTH: &str = "the secure port authenticates bearer tokens only (TokenReview); client-certificate and front-proxy request-header authentication are not supported, so the `extension-apiserver-authentication` ConfigMap is not read";
const REVIEW_CACHE: &str =
    "the secure port caches TokenReview and SubjectAccessReview answers for kcm's default, 10 s";
const TLS_DEFAULTS: &str = "the secure port uses rustls's defaults: TLS 1.2 and 1.3 with their safe cipher suites and key-exchange groups";
const HTTP1_ONLY: &str = "the secure port serves HTTP/1.1 only";
const METRICS: &str = "this controller's metric set is fixed (see docs/operations.md, metrics)";
const LOG_STREAM: &str = "every log line goes to stderr, unbuffered";
const PROFILING: &str = "no /debug/pprof endpoint is served";
const KLOG_REMOVED: &str =
    "klog flag removed from kube-controller-manager in 1.26; logs go to stderr";

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
#[rustfmt::skip]
pub const KCM_FLAGS: &[KcmFlag] = &[
    flag("add-dir-header", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("address", Value, KcmRemoved, Ignored(
        "insecure serving was removed from kube-controller-manager in 1.24")),
    flag("allocate-node-cidrs", Bool, Both, Implemented(
        "as kcm; default true here (kcm: false), `false` runs without allocating and `plan` refuses it")),
    flag("allow-metric-labels", Value, Both, Ignored(METRICS)),
    flag("allow-metric-labels-manifest", Value, Both, Ignored(METRICS)),
    flag("allow-node-mask-label", Bool, Ours, Implemented(
        "with `--cidr-allocator-type=CloudAllocator`: the Nodes' `nodeipam.io/node-cidr-mask-size-ipv4`/`-ipv6` labels size their blocks, before the rules, within `--node-mask-label-range` (see docs/node-pools.md)")),
    flag("allow-untagged-cloud", Bool, Both, Ignored(CLOUD)),
    flag("alsologtostderr", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("attach-detach-reconcile-sync-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("authentication-kubeconfig", Value, Both, Implemented(
        "as kcm: the kubeconfig of the API server that answers the secure port's TokenReviews (default: the controller's own client)")),
    flag("authentication-skip-lookup", Bool, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("authentication-token-webhook-cache-ttl", Value, Both, Ignored(REVIEW_CACHE)),
    flag("authentication-tolerate-lookup-failure", Bool, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("authorization-always-allow-paths", Value, Both, Implemented(
        "as kcm: paths the secure port serves without a token (default `/healthz,/readyz,/livez`; a trailing `*` matches a prefix)")),
    flag("authorization-kubeconfig", Value, Both, Implemented(
        "as kcm: the kubeconfig of the API server that answers the secure port's SubjectAccessReviews (default: the controller's own client)")),
    flag("authorization-webhook-cache-authorized-ttl", Value, Both, Ignored(REVIEW_CACHE)),
    flag("authorization-webhook-cache-unauthorized-ttl", Value, Both, Ignored(REVIEW_CACHE)),
    flag("bind-address", Value, Both, Implemented(
        "as kcm: the IP the secure port listens on (default `0.0.0.0`; empty or unspecified listens on every interface)")),
    flag("cert-dir", Value, Both, Ignored(
        "without `--tls-cert-file` the self-signed certificate is kept in memory, never written to a directory")),
    // kcm's `CloudAllocator` "uses cloud platform support to do node CIDR range allocations"
    // (`pkg/controller/nodeipam/ipam/cidr_allocator.go`); ours is cloud-provider-azure's.
    flag("cidr-allocator-type", Value, Both, Implemented(
        "`RangeAllocator` (the default: every Node gets the node CIDR mask size), `CloudAllocator` (per-Node sizes from `--node-cidr-mask-size-rule` and the mask labels, as cloud-provider-azure's allocator sizes its node pools; kcm's `CloudAllocator` takes the ranges from the cloud instead) or `MultiCIDRRangeAllocator` (KEP-2593's, removed from kcm after 1.28: the flag CIDRs are the default pool and `nodeipam.io/v1alpha1` ClusterCIDR objects add pools with node selectors at run time; needs the CRD, see [Growing the pod network](growing-the-pod-network.md)); any other type exits 2")),
    flag("client-ca-file", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("cloud-config", Value, Both, Ignored(CLOUD)),
    flag("cloud-config-key", Value, AzureCcm, Ignored(CLOUD)),
    flag("cloud-config-secret-name", Value, AzureCcm, Ignored(CLOUD)),
    flag("cloud-config-secret-namespace", Value, AzureCcm, Ignored(CLOUD)),
    flag("cloud-provider", Value, Both, Ignored(CLOUD)),
    flag("cluster-cidr", Value, Both, Implemented("as kcm, and more than one CIDR per family (at most 8 in all, none overlapping; kcm refuses a second of a family): within a family they are used in the order given, a later one only when the earlier ones have no free block of the size a Node needs; the first entry's family is `spec.podCIDR`'s; the mask-size flags apply per family, to each CIDR of it (see [Growing the pod network](growing-the-pod-network.md))")),
    flag("cluster-name", Value, Both, Ignored(
        "names cloud resources; this controller does not use it")),
    flag("cluster-signing-cert-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-duration", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kube-apiserver-client-cert-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kube-apiserver-client-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kubelet-client-cert-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kubelet-client-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kubelet-serving-cert-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-kubelet-serving-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-legacy-unknown-cert-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("cluster-signing-legacy-unknown-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-cron-job-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-daemonset-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-deployment-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-device-taint-eviction-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-endpoint-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-ephemeralvolume-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-eviction-request-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-gc-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-horizontal-pod-autoscaler-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-job-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-leader-election-lease-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-namespace-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-node-status-updates", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-node-syncs", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-rc-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-replicaset-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-resource-quota-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-resourceclaim-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-service-endpoint-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-service-syncs", Value, Both, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-serviceaccount-token-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-statefulset-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-ttl-after-finished-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("concurrent-validating-admission-policy-status-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("configure-cloud-routes", Bool, Both, Ignored(
        "routes are the route controller's job, not run here")),
    flag("contention-profiling", Bool, Both, Ignored(PROFILING)),
    flag("controller-start-interval", Value, Both, Ignored("this process starts one controller")),
    flag("controllers", Value, Both, Implemented(
        "read as kcm does (`*`, `name`, `-name`; first match wins; the node IPAM controller is `nodeipam`/`node-ipam-controller` in kcm and `node-ipam` in cloud-provider-azure's ccm); a list that disables it exits 2, since this process is that controller; other names are not checked")),
    flag("deleted-node-cidr-quarantine", Value, Ours, Implemented(
        "how long the pod CIDRs of a deleted Node stay reserved for its name before a Node waiting for a block may take them (default `10s`; `0` releases them at once). `kubectl replace --force` creates the Node again one request after the deletion completes (milliseconds), a restore or a scripted delete-and-create within seconds: 10 s covers those and the watch's delivery lag, so the re-created Node keeps its block (or gets it back if it has no podCIDRs) instead of a waiting Node taking it. Liveness only: a quarantine that ends first leaves the re-created Node holding a block given away, reported as `PodCIDRConflict`, never kept twice (see docs/deleted-nodes.md)")),
    flag("deployment-controller-sync-period", Value, KcmRemoved, Ignored(OTHER_CONTROLLER)),
    flag("disable-attach-detach-reconcile-sync", Bool, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("disable-force-detach-on-timeout", Bool, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("disable-http2-serving", Bool, Both, Ignored(HTTP1_ONLY)),
    flag("disabled-metrics", Value, Both, Ignored(METRICS)),
    flag("enable-dynamic-provisioning", Bool, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("enable-dynamic-reloading", Bool, AzureCcm, Ignored(CLOUD)),
    flag("enable-garbage-collector", Bool, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("enable-hostpath-provisioner", Bool, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("enable-leader-migration", Bool, Both, Ignored(
        "leader migration hands controllers between kcm and ccm under one Lease; this controller always takes its own Lease (--leader-elect-resource-name)")),
    flag("enable-taint-manager", Bool, KcmRemoved, Ignored(OTHER_CONTROLLER)),
    flag("endpoint-updates-batch-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("endpointslice-updates-batch-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("experimental-cluster-signing-duration", Value, KcmRemoved, Ignored(OTHER_CONTROLLER)),
    flag("external-cloud-volume-plugin", Value, Both, Ignored(CLOUD)),
    flag("feature-gates", Value, Both, Ignored(
        "no kube-controller-manager feature gate changes this controller's allocation")),
    flag("flex-volume-plugin-dir", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("health-probe-bind-address", Value, Ours, Implemented(
        "`/healthz`, `/livez` and `/readyz` over plain HTTP without authentication, for local use: **off by default** (`0`: kcm serves its probes only on its secure port); e.g. `127.0.0.1:8081` turns it on; at most 64 connections at once and headers within 30 s, as `--secure-port`; in a cluster, probe `--secure-port`")),
    flag("horizontal-pod-autoscaler-cpu-initialization-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("horizontal-pod-autoscaler-downscale-stabilization", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("horizontal-pod-autoscaler-initial-readiness-delay", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("horizontal-pod-autoscaler-sync-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("horizontal-pod-autoscaler-tolerance", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("http2-max-streams-per-connection", Value, Both, Ignored(HTTP1_ONLY)),
    flag("kube-api-burst", Value, Both, Implemented(
        "as kcm (default 30), for this controller's writes (token bucket)")),
    flag("kube-api-content-type", Value, Both, Ignored("requests are sent as JSON")),
    flag("kube-api-qps", Value, Both, Implemented(
        "as kcm (default 20), for this controller's writes (token bucket)")),
    flag("kubeconfig", Value, Both, Implemented("as kcm (`clientcmd.BuildConfigFromFlags`)")),
    flag("large-cluster-size-threshold", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("leader-elect", Bool, Both, Implemented("as kcm (default true)")),
    flag("leader-elect-lease-duration", Value, Both, Implemented("as kcm (15s)")),
    flag("leader-elect-renew-deadline", Value, Both, Implemented("as kcm (10s)")),
    flag("leader-elect-resource-lock", Value, Both, Implemented(
        "`leases` (the default) only, as kcm: another lock with --leader-elect exits 2")),
    flag("leader-elect-resource-name", Value, Both, Implemented(
        "default `nodeipam-controller` (kcm: `kube-controller-manager`); kcm's or ccm's own Lease name exits 2: sharing it would make this controller and kcm exclude each other")),
    flag("leader-elect-resource-namespace", Value, Both, Implemented("as kcm (kube-system)")),
    flag("leader-elect-retry-period", Value, Both, Implemented("as kcm (2s)")),
    flag("leader-migration-config", Value, Both, Ignored("see --enable-leader-migration")),
    flag("legacy-service-account-token-clean-up-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("log-backtrace-at", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-dir", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-file", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-file-max-size", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("log-flush-frequency", Value, Both, Ignored(LOG_STREAM)),
    flag("log-format", Value, AzureCcm, Implemented(
        "alias of --logging-format (cloud-provider-azure's name)")),
    flag("log-json-info-buffer-size", Value, Both, Ignored(LOG_STREAM)),
    flag("log-json-split-stream", Bool, Both, Ignored(LOG_STREAM)),
    flag("log-text-info-buffer-size", Value, Both, Ignored(LOG_STREAM)),
    flag("log-text-split-stream", Bool, Both, Ignored(LOG_STREAM)),
    flag("logging-format", Value, Kcm, Implemented(
        "`text` (default) or `json`: JSON lines with klog's field names (`ts`, `caller`, `msg`, `v`, structured keys)")),
    flag("logtostderr", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("master", Value, Both, Implemented(
        "as kcm (`clientcmd.BuildConfigFromFlags`): alone, no credentials are sent")),
    flag("max-endpoints-per-slice", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("metrics-bind-address", Value, Ours, Implemented(
        "Prometheus `/metrics` over plain HTTP **without authentication**, for local use: **off by default** (`0`: kcm serves its metrics only on its secure port); e.g. `127.0.0.1:8080` turns it on; at most 64 connections at once and headers within 30 s, as `--secure-port`; in a cluster, scrape the authenticated `--secure-port`, as kcm serves its metrics")),
    flag("min-resync-period", Value, Both, Ignored(
        "the informer watches every Node change and never resyncs")),
    flag("mirroring-concurrent-service-endpoint-syncs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("mirroring-endpointslice-updates-batch-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("mirroring-max-endpoints-per-subset", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("namespace-sync-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("node-cidr-mask-size", Value, Both, Implemented("as kcm")),
    flag("node-cidr-mask-size-ipv4", Value, Both, Implemented("as kcm")),
    flag("node-cidr-mask-size-ipv6", Value, Both, Implemented("as kcm")),
    flag("node-cidr-mask-size-rule", Value, Ours, Implemented(
        "with `--cidr-allocator-type=CloudAllocator`, repeatable: `KEY=VALUE:ipv4=N,ipv6=M` gives the Nodes whose label KEY equals VALUE /N and /M blocks; the first matching rule wins (see docs/node-pools.md)")),
    flag("node-cidr-mask-size-rules-file", Value, Ours, Implemented(
        "with `--cidr-allocator-type=CloudAllocator`: more rules in `--node-cidr-mask-size-rule`'s syntax, one per line, after the flags' rules")),
    flag("node-cidr-update-workers", Value, Ours, Implemented(
        "concurrent writes of spec.podCIDR(s) (default 30, the number of `cidrUpdateWorkers` kcm's range allocator runs)")),
    flag("node-eviction-rate", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("node-filter-requirements", Value, AzureCcm, Implemented(
        "empty only: a selector would make cloud-provider-azure's node IPAM controller serve only the matching Nodes, which this controller does not do, so a non-empty one exits 2")),
    flag("node-mask-label-range", Value, Ours, Implemented(
        "with `--allow-node-mask-label`: `ipv4=MIN-MAX,ipv6=MIN-MAX`, the sizes a mask label may ask for (default: the coarsest to the finest size the default and the rules give)")),
    flag("node-monitor-grace-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("node-monitor-period", Value, Both, Ignored(OTHER_CONTROLLER)),
    flag("node-selector", Value, Ours, Implemented(
        "serve only the Nodes this label selector selects (`a=b,c!=d,e in (x,y),!f`; default every Node); the others are never written, and the podCIDRs they have stay occupied (see docs/node-selector.md)")),
    flag("node-startup-grace-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("node-status-update-frequency", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("node-sync-period", Value, Both, Ignored("deprecated no-op upstream")),
    flag("one-output", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("permit-address-sharing", Bool, Both, Ignored(
        "the secure port's listener (tokio) always sets SO_REUSEADDR, as this flag does in kcm")),
    flag("permit-port-sharing", Bool, Both, Ignored(
        "SO_REUSEPORT is never set: one process owns the secure port")),
    flag("pod-eviction-timeout", Value, KcmRemoved, Ignored(OTHER_CONTROLLER)),
    flag("port", Value, KcmRemoved, Ignored(
        "insecure serving was removed from kube-controller-manager in 1.24")),
    flag("profiling", Bool, Both, Ignored(PROFILING)),
    flag("pv-recycler-increment-timeout-nfs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pv-recycler-minimum-timeout-hostpath", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pv-recycler-minimum-timeout-nfs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pv-recycler-pod-template-filepath-hostpath", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pv-recycler-pod-template-filepath-nfs", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pv-recycler-timeout-increment-hostpath", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("pvclaimbinder-sync-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("requestheader-allowed-names", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("requestheader-client-ca-file", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("requestheader-extra-headers-prefix", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("requestheader-group-headers", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("requestheader-uid-headers", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("requestheader-username-headers", Value, Both, Ignored(CLIENT_CERT_AUTH)),
    flag("resource-quota-sync-period", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("root-ca-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("route-reconciliation-period", Value, Both, Ignored(OTHER_CONTROLLER)),
    flag("secondary-node-eviction-rate", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("secure-port", Value, Both, Implemented(
        "as kcm: HTTPS for `/healthz`, `/livez`, `/readyz` and `/metrics` with delegated authentication (TokenReview) and authorization (SubjectAccessReview), answers cached 10 s (default 10257; `0` turns it off; see docs/operations.md)")),
    flag("service-account-private-key-file", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("service-cluster-ip-range", Value, Both, Implemented(
        "as kcm: node blocks that overlap it are never allocated")),
    flag("show-hidden-metrics-for-version", Value, Both, Ignored(METRICS)),
    flag("skip-headers", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("skip-log-headers", Bool, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("stderrthreshold", Value, KcmRemoved, Ignored(KLOG_REMOVED)),
    flag("terminated-pod-gc-threshold", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("tls-cert-file", Value, Both, Implemented(
        "as kcm: the PEM serving certificate (and intermediates), re-read every minute; without it and `--tls-private-key-file`, a self-signed certificate for `localhost` is generated in memory")),
    flag("tls-cipher-suites", Value, Both, Ignored(TLS_DEFAULTS)),
    flag("tls-curve-preferences", Value, Both, Ignored(TLS_DEFAULTS)),
    flag("tls-min-version", Value, Both, Ignored(TLS_DEFAULTS)),
    flag("tls-private-key-file", Value, Both, Implemented(
        "as kcm: the PEM private key of `--tls-cert-file` (give both or neither)")),
    flag("tls-sni-cert-key", Value, Both, Ignored(
        "the secure port serves one certificate (`--tls-cert-file` or the self-signed one) whatever the SNI name")),
    flag("unhealthy-zone-threshold", Value, Kcm, Ignored(OTHER_CONTROLLER)),
    flag("use-service-account-credentials", Bool, Both, Ignored(
        "requests use the --kubeconfig (or in-cluster) credentials; kcm's node IPAM controller would use the kube-system/node-controller service account: grant this controller's identity the RBAC in docs/install.md")),
    flag("v", Value, Both, Implemented(
        "klog verbosity (`-v N`, `--v=N`), mapped onto log levels (see docs/logs.md)")),
    flag("vmodule", Value, Both, Ignored("per-module levels are set with RUST_LOG")),
    flag("webhook-bind-address", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-cert-dir", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-disable-http2-serving", Bool, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-secure-port", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-cert-file", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-cipher-suites", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-curve-preferences", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-min-version", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-private-key-file", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhook-tls-sni-cert-key", Value, Ccm, Ignored(OTHER_CONTROLLER)),
    flag("webhooks", Value, Ccm, Ignored(OTHER_CONTROLLER)),
];
