//! Reading kube-rs client errors: their whole cause chain on one line, whether the connection
//! could not even be opened (nothing was sent), whether the client itself is broken for good.
//! Used by the controller's informer, workers and PATCH classification, and by the secure port's
//! TokenReview/SubjectAccessReview clients.

use std::error::Error as _;

/// Whether a client-stack error says the TCP/TLS connection could not be opened (so nothing was
/// sent).
pub fn is_connect_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>()
            && client.is_connect()
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Whether the client itself is broken for good: the kube client's request buffer lost its
/// worker task (it panicked), so every later request fails the same way. The controller then
/// fails its health check and exits instead of retrying forever.
pub fn is_client_broken(error: &kube::Error) -> bool {
    let kube::Error::Service(source) = error else {
        return false;
    };
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(e) = current {
        if e.is::<tower::buffer::error::Closed>() || e.is::<tower::buffer::error::ServiceError>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// `error` and its causes on one line.
pub fn error_chain(error: &kube::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
