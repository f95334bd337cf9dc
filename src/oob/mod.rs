pub mod interfaces;
pub mod uri;
