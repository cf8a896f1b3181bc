//! PromQL over gpuwatch's tables: the Prometheus HTTP query API ([`api`]).
//!
//! Data flow: a request's parameters ([`params`]) and expression (parsed by `promql-parser`,
//! checked by [`check`]) go to the [`eval::Evaluator`], which evaluates the expression at every
//! step of the query's grid at once. Selectors become one SQL scan each on the DataFusion engine
//! of `gpuwatch-query` ([`select`]: time range, metric and label equalities pushed down, rows
//! turned into series); functions ([`functions`], [`rangefn`]), aggregations ([`aggregate`])
//! and operators ([`binary`]) then work in memory, step by step, as Prometheus 2.42 does. The
//! answer is written in Prometheus's JSON ([`json`]).

pub mod aggregate;
pub mod api;
pub mod binary;
pub mod check;
pub mod error;
pub mod eval;
pub mod functions;
pub mod json;
pub mod labels;
pub mod metadata;
pub mod params;
pub mod rangefn;
pub mod select;

pub use api::{parse_query, router};
pub use error::{Error, ErrorType, Result};
pub use eval::{Evaluator, Grid, Series, Settings, Value};
