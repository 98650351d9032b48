//! placeholder crate root; filled in by the fake GitLab work.
