//! nodeipam-core: placeholder, filled in by the allocation-core issue.
#![no_std]
#![forbid(unsafe_code)]
