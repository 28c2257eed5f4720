//! An apiserver call that failed, saying which call and which object: both controllers' errors
//! carry one, and the log line names what to look at.

#[derive(Debug, thiserror::Error)]
#[error("{doing}: {source}")]
pub struct ApiCallError {
    /// The call and its object: "creating pod ns/name", "writing the status of job ns/name".
    pub doing: String,
    #[source]
    pub source: kube::Error,
}

impl ApiCallError {
    /// For `map_err`: the apiserver failed while `doing` something.
    pub fn doing(doing: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let doing = doing.into();
        move |source| Self { doing, source }
    }

    /// The apiserver refused the call for good (an admission rule, a quota, a RuntimeClass that
    /// does not exist, RBAC, an invalid object): a 4xx other than a conflict, a timeout or
    /// throttling, which are worth retrying. The user's to fix, so it is said on the object.
    /// Returns the apiserver's words then.
    pub fn refusal(&self) -> Option<&str> {
        match &self.source {
            kube::Error::Api(e)
                if (400..500).contains(&e.code) && !matches!(e.code, 408 | 409 | 429) =>
            {
                Some(e.message.as_str())
            }
            _ => None,
        }
    }
}
