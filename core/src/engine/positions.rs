//! Learned positional embeddings (OPT): the row of position `p` is added to the token's
//! embedding before the first block.

use crate::cpu;
use crate::model::Model;
use crate::{Error, Result};

/// OPT's learned positions start at row 2 (Hugging Face's `OPTLearnedPositionalEmbedding`
/// offset, which PowerInfer's graph applies too), so a table of `P` rows serves `P − 2` positions.
pub const OPT_POSITION_OFFSET: usize = 2;

/// Adds the positional embedding of positions `pos0, pos0 + 1, …` to the rows of `x`, when the
/// model has a table; an error when a position is past its end.
pub(super) fn add_learned_positions(model: &Model, x: &mut [f32], pos0: usize) -> Result<()> {
    let Some(table) = &model.pos_embd else {
        return Ok(());
    };
    let m = model.matrix(table);
    let mut row_buf = vec![0f32; model.hp.n_embd];
    for (t, row) in x.chunks_exact_mut(model.hp.n_embd).enumerate() {
        let r = pos0 + t + OPT_POSITION_OFFSET;
        if r >= table.rows {
            return Err(Error::InvalidArgument(format!(
                "position {} is past the model's {} learned positions (use a smaller -c)",
                pos0 + t,
                table.rows.saturating_sub(OPT_POSITION_OFFSET)
            )));
        }
        cpu::dequantize_row(&m, r, &mut row_buf)?;
        crate::cpu::ops::add_assign(row, &row_buf);
    }
    Ok(())
}
