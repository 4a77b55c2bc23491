//! Why the configuration could not be loaded.

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The parse error (with line and column).
        source: Box<toml::de::Error>,
    },
    /// A value is out of its allowed range.
    #[error("config: {0}")]
    Invalid(String),
}
