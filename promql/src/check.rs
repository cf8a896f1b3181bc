//! What gpuwatch evaluates: everything of Prometheus 2.42's PromQL but native histograms and
//! the experimental functions; the rest is refused up front as `bad_data`, naming it.

use promql_parser::parser::Expr;
use promql_parser::parser::token::{T_LIMIT_RATIO, T_LIMITK};

use crate::error::{Result, bad};
use crate::functions::SUPPORTED;

/// Fails with `bad_data` naming the first thing in `e` gpuwatch does not evaluate.
pub fn supported(e: &Expr) -> Result<()> {
    match e {
        Expr::Aggregate(a) => {
            let op = a.op.id();
            if op == T_LIMITK || op == T_LIMIT_RATIO {
                return Err(bad(format!(
                    "aggregation {} is not supported by gpuwatch (it is not in Prometheus 2.42)",
                    a.op
                )));
            }
            supported(&a.expr)?;
            if let Some(p) = &a.param {
                supported(p)?;
            }
            Ok(())
        }
        Expr::Unary(u) => supported(&u.expr),
        Expr::Binary(b) => {
            supported(&b.lhs)?;
            supported(&b.rhs)
        }
        Expr::Paren(p) => supported(&p.expr),
        Expr::Subquery(s) => supported(&s.expr),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => Ok(()),
        Expr::VectorSelector(vs) => selector(&vs.matchers),
        Expr::MatrixSelector(ms) => selector(&ms.vs.matchers),
        Expr::Call(c) => {
            if !SUPPORTED.contains(&c.func.name) {
                return Err(bad(format!(
                    "function {}() is not supported by gpuwatch (docs/promql.md lists what is)",
                    c.func.name
                )));
            }
            for a in &c.args.args {
                supported(a)?;
            }
            Ok(())
        }
        Expr::Extension(_) => Err(bad("extension expressions are not supported")),
    }
}

fn selector(m: &promql_parser::label::Matchers) -> Result<()> {
    if !m.or_matchers.is_empty() {
        return Err(bad(
            "the \"or\" form of label matchers is not supported (Prometheus 2.42 has none)",
        ));
    }
    Ok(())
}
