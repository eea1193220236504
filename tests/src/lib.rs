//! Test support for nodeipam: placeholder.
