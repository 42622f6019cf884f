//! Why the suite could not run at all (a check failing is a [`crate::Report`], not this).

/// Why the suite could not run at all (a check failing is a [`crate::Report`], not this).
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot read the component {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot load the component: {0}")]
    Load(String),
    #[error("cannot start the simulator: {0}")]
    Simulator(String),
    #[error(
        "cannot tell which fabric the provider is for{0}: pass --fabric fti, redfish or nec, or --fabric-sim URL for a simulator of its own fabric"
    )]
    NoFabric(String),
    #[error("provider spec: {0}")]
    Spec(String),
    #[error("--fabric and --fti-api choose one of cro's simulators; --fabric-sim names another")]
    FabricWithSimulator,
    #[error("an FTI API (--fti-api) was chosen for a {0} provider; it applies to FTI only")]
    FtiApiForOtherFabric(&'static str),
}
