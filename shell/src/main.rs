//! nodeipam-controller: placeholder until the controller issue.
fn main() {}
