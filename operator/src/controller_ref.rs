//! Whose an object under a name floe writes is, read from its controller reference: one name,
//! one owner at a time, so an object of a deleted owner of the same kind and name (garbage
//! collection deletes it soon) is told apart from anyone else's (a user's own, another
//! controller's), which floe never writes or deletes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Whose an object is, for an owner of `kind`, `name` and `uid`.
#[derive(Debug, PartialEq)]
pub(crate) enum Holder<'a> {
    /// This owner made it (its controller reference names the owner's UID).
    This,
    /// An earlier floe object of this kind and name, deleted: its UID.
    Earlier { uid: &'a str },
    /// Anything else: another controller (named), or none.
    Other(Option<&'a OwnerReference>),
}

pub(crate) fn holder<'a>(meta: &'a ObjectMeta, kind: &str, name: &str, uid: &str) -> Holder<'a> {
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    match controller {
        Some(o) if o.uid == uid => Holder::This,
        Some(o) if o.kind == kind && o.name == name && o.api_version.starts_with("floe.dev/") => {
            Holder::Earlier { uid: &o.uid }
        }
        other => Holder::Other(other),
    }
}
