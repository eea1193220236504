//! LIST: resourceVersion semantics, pagination with consistent snapshots, selectors.
//!
//! A paginated list is served from a snapshot of the resource taken once, at its first page (the
//! list's resourceVersion), and kept while its resourceVersion is within the change history: each
//! page after the first is a binary search for the continue key plus `limit` items, so a list of N
//! objects in pages of L costs O(N) for the snapshot once and O(log N + L) per page, not O(N) per
//! page. A continue token names the snapshot's resourceVersion and the last key served; as in
//! kube-apiserver (etcd3 `store.GetList` reads at the token's revision) the next page is the state
//! at that resourceVersion, and a token whose resourceVersion has left the history is
//! **410 Expired** (`interpretListError` → `handleCompactedErrorForPaging`,
//! `apiserver/pkg/storage/etcd3/errors.go`), with a new token in `metadata.continue` that
//! continues at the latest state. A snapshot not in the cache (evicted: at most
//! [`MAX_SNAPSHOTS`] are kept) is rebuilt from the history.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use super::object::StoredObject;
use super::resource::Resource;
use super::select::Selector;
use super::status::ApiError;
use super::store::{Key, Store};

/// List snapshots kept for continue tokens (the most recently used ones).
pub const MAX_SNAPSHOTS: usize = 8;

/// Message of kube-apiserver's 410 for a continue token older than the history
/// (`inconsistentContinue` in `apiserver/pkg/storage/etcd3/errors.go`).
pub const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// List query parameters (already validated, see [`super::options`]).
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub resource_version_match: Option<String>,
    /// `limit` (0 = none).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
}

/// The objects of one resource at one resourceVersion, in key order (all namespaces).
#[derive(Debug)]
pub struct ListSnapshot {
    res: Resource,
    rv: u64,
    items: Vec<Arc<StoredObject>>,
}

impl ListSnapshot {
    /// The resourceVersion of the snapshot.
    pub fn rv(&self) -> u64 {
        self.rv
    }
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// Resource listed.
    pub res: Resource,
    /// `metadata.resourceVersion` of the list.
    pub rv: u64,
    /// The items.
    pub items: Vec<Arc<StoredObject>>,
    /// `metadata.continue`, when more items follow.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount` (only without selectors, as kube-apiserver).
    pub remaining: Option<usize>,
}

impl ListPage {
    /// The `*List` document: `{"kind":…,"apiVersion":…,"metadata":{…},"items":[…]}`, items
    /// copied from their stored JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let mut meta = json!({"resourceVersion": self.rv.to_string()});
        if let Some(c) = &self.continue_token {
            meta["continue"] = json!(c);
        }
        if let Some(r) = self.remaining {
            meta["remainingItemCount"] = json!(r);
        }
        let size: usize = self.items.iter().map(|o| o.json_len() + 1).sum();
        let mut out = Vec::with_capacity(size + 160);
        out.extend_from_slice(b"{\"kind\":\"");
        out.extend_from_slice(self.res.list_kind().as_bytes());
        out.extend_from_slice(b"\",\"apiVersion\":\"");
        out.extend_from_slice(self.res.api_version().as_bytes());
        out.extend_from_slice(b"\",\"metadata\":");
        out.extend_from_slice(meta.to_string().as_bytes());
        out.extend_from_slice(b",\"items\":[");
        for (i, o) in self.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(o.item_json());
        }
        out.extend_from_slice(b"]}");
        out
    }
}

/// Where a continue token points: the snapshot's resourceVersion (`None` = the latest state,
/// after a 410) and the last key served.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ContinueKey {
    rv: Option<u64>,
    ns: String,
    name: String,
}

fn to_hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

impl ContinueKey {
    fn encode(&self) -> String {
        let rv = self.rv.map_or_else(|| "-1".to_owned(), |r| r.to_string());
        to_hex(&format!("{rv}/{}/{}", self.ns, self.name))
    }

    /// # Errors
    /// 400 `continue key is not valid` (kube-apiserver: `invalid continue token`).
    fn decode(token: &str) -> Result<Self, ApiError> {
        let bad = || ApiError::bad_request("invalid continue token: continue key is not valid");
        let decoded = from_hex(token).ok_or_else(bad)?;
        let mut parts = decoded.splitn(3, '/');
        let rv = match parts.next() {
            Some("-1") => None,
            Some(r) => Some(r.parse::<u64>().map_err(|_| bad())?),
            None => return Err(bad()),
        };
        Ok(ContinueKey {
            rv,
            ns: parts.next().ok_or_else(bad)?.to_owned(),
            name: parts.next().ok_or_else(bad)?.to_owned(),
        })
    }
}

impl Store {
    /// The resourceVersion a list without a continue token is served at.
    ///
    /// `""` ⇒ the latest; `"0"` or `N` (with or without `NotOlderThan`) ⇒ the latest, which is at
    /// least `N`; `N` with `Exact`, or `N` ≠ 0 without a match but with a `limit`, ⇒ exactly `N`. `N` above the current resourceVersion ⇒ **504**
    /// `Too large resource version` (`storage.NewTooLargeResourceVersionError`).
    fn list_rv(&self, p: &ListParams) -> Result<u64, ApiError> {
        let requested = match p.resource_version.as_deref() {
            None | Some("") => None,
            Some(s) => Some(
                s.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
            ),
        };
        match (requested, p.resource_version_match.as_deref()) {
            (Some(r), _) if r > self.rv => Err(ApiError::too_large_resource_version(r, self.rv)),
            (Some(r), Some("Exact")) => Ok(r),
            // The legacy exact read: `N` (not 0) without a match but with a `limit` lists exactly
            // at `N` (`shouldDelegateList` in apiserver/pkg/storage/cacher/delegator.go sends it
            // to etcd, whose `GetList` reads at that revision; v1.36.3 answers so).
            (Some(r), None | Some("")) if p.limit > 0 && r != 0 => Ok(r),
            _ => Ok(self.rv),
        }
    }

    /// The objects of `res` at `rv`, in key order: the current objects with the history newer
    /// than `rv` undone.
    ///
    /// # Errors
    /// 410 Expired when `rv` is older than the history.
    fn snapshot_at(&self, res: Resource, rv: u64) -> Result<Vec<Arc<StoredObject>>, ApiError> {
        if rv < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.compacted_rv
            )));
        }
        if rv == self.rv {
            return Ok(self.stored(res, None).cloned().collect());
        }
        let mut state: BTreeMap<&Key, Arc<StoredObject>> = self
            .stored(res, None)
            .map(|o| (o.key(), Arc::clone(o)))
            .collect();
        for c in self.history.iter().rev().take_while(|c| c.rv() > rv) {
            if c.key().res != res {
                continue;
            }
            match &c.prev {
                Some(p) => {
                    state.insert(p.key(), Arc::clone(p));
                }
                None => {
                    state.remove(c.key());
                }
            }
        }
        Ok(state.into_values().collect())
    }

    /// The snapshot of `res` at `rv`, from the cache or built (and cached).
    fn snapshot(&mut self, res: Resource, rv: u64) -> Result<Arc<ListSnapshot>, ApiError> {
        if let Some(i) = self
            .snapshots
            .iter()
            .position(|s| s.res == res && s.rv == rv)
        {
            let s = self
                .snapshots
                .remove(i)
                .ok_or_else(|| ApiError::internal("snapshot"))?;
            self.snapshots.push_back(Arc::clone(&s));
            return Ok(s);
        }
        let snap = Arc::new(ListSnapshot {
            res,
            rv,
            items: self.snapshot_at(res, rv)?,
        });
        self.snapshots.push_back(Arc::clone(&snap));
        while self.snapshots.len() > MAX_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        Ok(snap)
    }

    /// LIST with resourceVersion semantics, pagination and selectors.
    ///
    /// # Errors
    /// 410 Expired for a continue token or exact resourceVersion older than the history (with a
    /// continue-at-latest token for the former), 504 for a resourceVersion from the future, 400
    /// for a malformed token or resourceVersion.
    pub fn list(
        &mut self,
        res: Resource,
        ns: Option<&str>,
        p: &ListParams,
    ) -> Result<ListPage, ApiError> {
        let (rv, after) = match p.continue_token.as_deref() {
            Some(tok) if !tok.is_empty() => {
                let key = ContinueKey::decode(tok)?;
                let rv = match key.rv {
                    None => self.rv,
                    Some(rv) if rv < self.compacted_rv => {
                        let latest = ContinueKey { rv: None, ..key };
                        return Err(
                            ApiError::expired(INCONSISTENT_CONTINUE).with_continue(latest.encode())
                        );
                    }
                    Some(rv) => rv,
                };
                (rv, Some((key.ns, key.name)))
            }
            _ => (self.list_rv(p)?, None),
        };
        // kube-apiserver serves `resourceVersion=0` from its watch cache, which ignores `limit`
        // (`computeListLimit` in apiserver/pkg/storage/cacher/cacher.go, v1.36.3: "the limit is
        // ignored for requests that set RV == 0"): one page with every item, no continue token.
        let limit = if p.resource_version.as_deref() == Some("0") {
            0
        } else {
            p.limit
        };
        if limit == 0 {
            let items: Vec<Arc<StoredObject>> = if rv == self.rv {
                self.stored(res, ns)
                    .filter(|o| p.selector.matches_object(o))
                    .cloned()
                    .collect()
            } else {
                self.snapshot_at(res, rv)?
                    .into_iter()
                    .filter(|o| ns.is_none_or(|n| o.key().ns == n) && p.selector.matches_object(o))
                    .collect()
            };
            return Ok(ListPage {
                res,
                rv,
                items,
                continue_token: None,
                remaining: None,
            });
        }
        let snap = self.snapshot(res, rv)?;
        Ok(page(&snap, ns, after, p))
    }
}

/// One page of `snap`: items of namespace `ns` (all when `None`) after `after`, matching the
/// selector, at most `p.limit`.
fn page(
    snap: &ListSnapshot,
    ns: Option<&str>,
    after: Option<(String, String)>,
    p: &ListParams,
) -> ListPage {
    let items = &snap.items;
    fn pos(o: &Arc<StoredObject>) -> (&str, &str) {
        (o.key().ns.as_str(), o.key().name.as_str())
    }
    let ns_start = ns.map_or(0, |n| items.partition_point(|o| o.key().ns.as_str() < n));
    let end = ns.map_or(items.len(), |n| {
        items.partition_point(|o| o.key().ns.as_str() <= n)
    });
    let start = match &after {
        Some((a_ns, a_name)) => items
            .partition_point(|o| pos(o) <= (a_ns.as_str(), a_name.as_str()))
            .max(ns_start),
        None => ns_start,
    };
    let mut out = Vec::with_capacity(p.limit.min(end.saturating_sub(start)));
    let mut next = start;
    while next < end && out.len() < p.limit {
        if let Some(o) = items.get(next)
            && p.selector.matches_object(o)
        {
            out.push(Arc::clone(o));
        }
        next += 1;
    }
    let more = items
        .get(next..end)
        .is_some_and(|rest| rest.iter().any(|o| p.selector.matches_object(o)));
    let continue_token = match (more, out.last()) {
        (true, Some(last)) => Some(
            ContinueKey {
                rv: Some(snap.rv),
                ns: last.key().ns.clone(),
                name: last.key().name.clone(),
            }
            .encode(),
        ),
        _ => None,
    };
    let remaining = (continue_token.is_some() && p.selector.is_empty()).then(|| end - next);
    ListPage {
        res: snap.res,
        rv: snap.rv,
        items: out,
        continue_token,
        remaining,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::store::ChangeType;
    use serde_json::{Value, json};

    fn lease(ns: &str, name: &str, rv: u64) -> Arc<StoredObject> {
        let v =
            json!({"metadata": {"name": name, "namespace": ns, "resourceVersion": rv.to_string()}});
        StoredObject::new(Key::new(Resource::Leases, ns, name), rv, &v, Vec::new())
    }

    fn names(page: &ListPage) -> Vec<String> {
        page.items
            .iter()
            .map(|o| format!("{}/{}", o.key().ns, o.key().name))
            .collect()
    }

    fn params(limit: usize, token: Option<String>) -> ListParams {
        ListParams {
            limit,
            continue_token: token,
            ..ListParams::default()
        }
    }

    /// kube-apiserver v1.36.3 answers `?resourceVersion=0&limit=2` over five Nodes with all five
    /// and no continue token (its watch cache ignores the limit; tests/FIDELITY.md), while
    /// `?resourceVersion=N&resourceVersionMatch=NotOlderThan&limit=2` still pages.
    #[test]
    fn resource_version_0_ignores_the_limit_as_the_watch_cache_does() {
        let mut s = Store::new(100);
        for (i, n) in ["1", "2", "3", "4", "5"].into_iter().enumerate() {
            s.insert_loaded(lease("a", n, i as u64 + 2));
        }
        s.rv = 6;
        let any = ListParams {
            resource_version: Some("0".to_owned()),
            ..params(2, None)
        };
        let page = s.list(Resource::Leases, None, &any).expect("rv=0");
        assert_eq!(
            (page.items.len(), page.continue_token, page.remaining),
            (5, None, None)
        );
        let not_older = ListParams {
            resource_version: Some("3".to_owned()),
            resource_version_match: Some("NotOlderThan".to_owned()),
            ..params(2, None)
        };
        let page = s.list(Resource::Leases, None, &not_older).expect("rv=3");
        assert_eq!((page.items.len(), page.remaining), (2, Some(3)));
    }

    /// kube-apiserver v1.36.3 answers `?resourceVersion=N&limit=2` (no `resourceVersionMatch`)
    /// with the list exactly at `N` (the legacy exact read), not the latest (tests/FIDELITY.md).
    #[test]
    fn resource_version_with_a_limit_and_no_match_lists_exactly_there() {
        let mut s = Store::new(100);
        for (i, n) in ["1", "2", "3", "4", "5"].into_iter().enumerate() {
            let rv = i as u64 + 2;
            s.rv = rv;
            s.commit(
                ChangeType::Added,
                lease("a", n, rv),
                None,
                (None, &json!({})),
            );
        }
        let legacy = ListParams {
            resource_version: Some("4".to_owned()),
            ..params(2, None)
        };
        let page = s.list(Resource::Leases, None, &legacy).expect("rv=4");
        assert_eq!(
            (names(&page), page.remaining, page.rv),
            (vec!["a/1".to_owned(), "a/2".to_owned()], Some(1), 4)
        );
        let next = ListParams {
            continue_token: page.continue_token.clone(),
            ..ListParams::default()
        };
        let rest = s
            .list(Resource::Leases, None, &ListParams { limit: 2, ..next })
            .expect("page 2");
        assert_eq!(
            (names(&rest), rest.continue_token),
            (vec!["a/3".to_owned()], None)
        );
    }

    #[test]
    fn pages_walk_a_snapshot_across_namespaces_and_writes() {
        let mut s = Store::new(100);
        for (i, (ns, n)) in [("a", "1"), ("a", "2"), ("b", "1"), ("b", "2"), ("b", "3")]
            .into_iter()
            .enumerate()
        {
            s.insert_loaded(lease(ns, n, i as u64 + 2));
        }
        s.rv = 6;
        let first = s
            .list(Resource::Leases, None, &params(2, None))
            .expect("page 1");
        assert_eq!(names(&first), ["a/1", "a/2"]);
        assert_eq!(first.remaining, Some(3));
        // A write after the first page is not in later pages.
        s.rv = 7;
        let prev = s.get(&Key::new(Resource::Leases, "b", "3")).cloned();
        s.commit(
            ChangeType::Deleted,
            lease("b", "3", 7),
            prev,
            (None, &json!({})),
        );
        let second = s
            .list(
                Resource::Leases,
                None,
                &params(2, first.continue_token.clone()),
            )
            .expect("page 2");
        assert_eq!(names(&second), ["b/1", "b/2"]);
        let third = s
            .list(
                Resource::Leases,
                None,
                &params(2, second.continue_token.clone()),
            )
            .expect("page 3");
        assert_eq!(
            (names(&third), third.continue_token.as_deref()),
            (vec!["b/3".to_owned()], None)
        );
        assert_eq!(third.rv, 6);
        // One namespace.
        let b = s
            .list(Resource::Leases, Some("b"), &params(1, None))
            .expect("ns b");
        assert_eq!((names(&b), b.remaining), (vec!["b/1".to_owned()], Some(1)));
        let b2 = s
            .list(
                Resource::Leases,
                Some("b"),
                &params(1, b.continue_token.clone()),
            )
            .expect("ns b page 2");
        assert_eq!(
            (names(&b2), b2.continue_token.as_deref()),
            (vec!["b/2".to_owned()], None)
        );
        // The snapshot from the first page is gone from the cache: rebuilt from the history.
        s.snapshots.clear();
        let again = s
            .list(
                Resource::Leases,
                None,
                &params(2, second.continue_token.clone()),
            )
            .expect("rebuilt");
        assert_eq!(names(&again), ["b/3"]);
        // Compacted: 410 with a token that continues at the latest state.
        s.compact();
        let e = s
            .list(
                Resource::Leases,
                None,
                &params(2, first.continue_token.clone()),
            )
            .expect_err("too old");
        assert_eq!((e.code, e.reason), (410, "Expired"));
        let status = e.to_status();
        let latest = status["metadata"]["continue"]
            .as_str()
            .expect("token")
            .to_owned();
        let rest = s
            .list(Resource::Leases, None, &params(5, Some(latest)))
            .expect("latest");
        assert_eq!(
            (names(&rest), rest.rv),
            (vec!["b/1".to_owned(), "b/2".to_owned()], 7)
        );
    }

    #[test]
    fn list_json_has_the_list_shape() {
        let page = ListPage {
            res: Resource::Leases,
            rv: 9,
            items: vec![lease("a", "1", 3), lease("a", "2", 4)],
            continue_token: Some("c".into()),
            remaining: Some(1),
        };
        let v: Value = serde_json::from_slice(&page.to_json()).expect("json");
        assert_eq!(v["kind"], "LeaseList");
        assert_eq!(
            v["metadata"],
            json!({"resourceVersion": "9", "continue": "c", "remainingItemCount": 1})
        );
        assert_eq!(v["items"][1]["metadata"]["name"], "2");
        assert!(v["items"][0].get("kind").is_none());
    }
}
