//! Plain GETs the benchmark polls: the sandbox's `/sandbox/summary`, the controller's `/metrics`
//! (through `kube::Client`, which speaks plain HTTP to any 127.0.0.1 server).

use std::time::Duration;

use serde::Deserialize;

/// `GET /sandbox/summary` of the sandbox API server (see `nodeipam_tests::sandbox::Summary`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Summary {
    /// Nodes stored.
    pub nodes: usize,
    /// Nodes with at least one `spec.podCIDRs` entry.
    #[serde(rename = "nodesWithPodCIDRs")]
    pub nodes_with_pod_cidrs: usize,
    /// Node PATCH requests received.
    pub patches: u64,
    /// Node LIST requests received (every page).
    pub lists: u64,
    /// Node WATCH requests received.
    pub watches: u64,
    /// 410 answers and in-stream ERROR 410 events on Node lists/watches.
    pub gone410: u64,
}

/// A client for `url` (`http://127.0.0.1:PORT`).
///
/// # Errors
/// A bad URL.
pub fn client(url: &str) -> Result<kube::Client, String> {
    let uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let mut config = kube::Config::new(uri);
    config.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(config).map_err(|e| format!("{url}: {e}"))
}

/// GET `path`, the body as text.
///
/// # Errors
/// Transport errors and non-2xx answers.
pub async fn get_text(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("GET {path}: {e}"))
}

/// The resourceVersion of a one-item Node LIST (JSON): where a watch of every later change starts.
///
/// # Errors
/// As [`get_text`], or an answer without `metadata.resourceVersion`.
pub async fn nodes_resource_version(client: &kube::Client) -> Result<String, String> {
    let text = get_text(client, "/api/v1/nodes?limit=1").await?;
    let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("LIST: {e}"))?;
    list["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| "LIST without resourceVersion".to_owned())
}

/// The sandbox's summary.
///
/// # Errors
/// As [`get_text`], or a body that is not a summary.
pub async fn summary(client: &kube::Client) -> Result<Summary, String> {
    let text = get_text(client, "/sandbox/summary").await?;
    serde_json::from_str(&text).map_err(|e| format!("/sandbox/summary: {e}: {text}"))
}

/// The value of the un-labelled sample `name` in Prometheus text, if present.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_unlabelled_sample() {
        let text = "# TYPE node_ipam_controller_workqueue_depth gauge\n\
                    node_ipam_controller_workqueue_depth_x 5\n\
                    node_ipam_controller_workqueue_depth 3\n";
        assert_eq!(
            metric(text, "node_ipam_controller_workqueue_depth"),
            Some(3.0)
        );
        assert_eq!(metric(text, "absent"), None);
    }
}
