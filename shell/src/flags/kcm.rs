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
//! hidden, accepted argument; docs/kcm-flags.md's flag table is rendered from it
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
    /// Short text for the flag table (docs/kcm-flags.md).
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

mod table;

pub use table::KCM_FLAGS;

use Handling::{Ignored, Implemented};
use Takes::{Bool, Value};

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

/// The flag table of every flag (docs/kcm-flags.md) (markdown), rendered from [`KCM_FLAGS`].
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
