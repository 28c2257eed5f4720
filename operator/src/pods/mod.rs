//! floe's pods, shared by both controllers: the names floe writes on them ([`names`]),
//! building a sandbox pod ([`sandbox`]), reading one ([`view`], sans-IO) and the writes both
//! controllers make ([`writes`]).

pub mod names;
pub mod sandbox;
pub mod swebench;
pub mod view;
pub mod writes;

/// Where a pod is in its life, as its `floe.dev/state` label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    Warming,
    Ready,
    Claimed,
    Done,
}

impl PodState {
    pub fn label(self) -> &'static str {
        match self {
            Self::Warming => "warming",
            Self::Ready => "ready",
            Self::Claimed => "claimed",
            Self::Done => "done",
        }
    }
}
