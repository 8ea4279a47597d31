//! The character-level language model: a decoder-only transformer in the
//! manner of GPT-2 (learned token and position embeddings; pre-norm blocks
//! of causal multi-head self-attention and a 4x GELU MLP, each added to
//! the residual stream; a final LayerNorm and a linear head over the
//! [`VOCAB`] characters). Built from candle's differentiable primitives
//! (LayerNorm and softmax composed, because candle's fused forms have no
//! backward); weights initialised as GPT-2 does (normal-like of standard
//! deviation 0.02, the residual projections scaled by 1/sqrt(2 x blocks)),
//! drawn from the run's seed.

use crate::data::VOCAB;
use candle_core::{D, Device, Module, Tensor};
use candle_nn::{Embedding, Linear, VarBuilder};
use serde::{Deserialize, Serialize};

/// The most transformer blocks a run builds (`--layers`).
pub const MAX_BLOCKS: usize = 256;

/// The longest window a run reads (`--context`).
pub const MAX_CONTEXT: usize = 4096;

/// The transformer's size (`gradwire train --model gpt`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct GptShape {
    /// GPT: transformer blocks.
    #[arg(long, default_value_t = GptShape::default().layers)]
    pub layers: usize,
    /// GPT: width of the residual stream (a multiple of --heads).
    #[arg(long, default_value_t = GptShape::default().width)]
    pub width: usize,
    /// GPT: attention heads per block.
    #[arg(long, default_value_t = GptShape::default().heads)]
    pub heads: usize,
    /// GPT: characters each window holds (the model reads them and
    /// predicts each next one).
    #[arg(long, default_value_t = GptShape::default().context)]
    pub context: usize,
}

impl Default for GptShape {
    fn default() -> Self {
        GptShape {
            layers: 4,
            width: 128,
            heads: 4,
            context: 64,
        }
    }
}

impl GptShape {
    /// The weights of each layer with a weight matrix, in build order
    /// (embeddings, per block the attention's and the MLP's matrices, the
    /// head); `None` if one does not fit a `usize`.
    pub fn layer_weights(&self) -> Option<Vec<usize>> {
        let d = self.width;
        let mut layers = vec![VOCAB.checked_mul(d)?, self.context.checked_mul(d)?];
        for _ in 0..self.layers {
            let square = d.checked_mul(d)?;
            layers.extend([
                square.checked_mul(3)?,
                square,
                square.checked_mul(4)?,
                square.checked_mul(4)?,
            ]);
        }
        layers.push(VOCAB.checked_mul(d)?);
        Some(layers)
    }

    /// Why this shape cannot be built, naming the flag; `None` if it can.
    /// Blocks and context are bounded (the causal mask alone is `context²`
    /// floats); the width by the largest layer a run may hold (checked
    /// with the other models' in `TrainConfig::validate`).
    pub fn problem(&self) -> Option<String> {
        if self.layers == 0 || self.width == 0 || self.heads == 0 || self.context == 0 {
            return Some("--layers, --width, --heads and --context must be at least 1".into());
        }
        if self.layers > MAX_BLOCKS {
            return Some(format!(
                "--layers must be at most {MAX_BLOCKS}, got {}",
                self.layers
            ));
        }
        if self.context > MAX_CONTEXT {
            return Some(format!(
                "--context must be at most {MAX_CONTEXT}, got {}",
                self.context
            ));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Some(format!(
                "--width ({}) must be a multiple of --heads ({})",
                self.width, self.heads
            ));
        }
        None
    }

    /// How the variable `name` starts: biases at 0, LayerNorm scales at
    /// 1, residual projections at a standard deviation of
    /// 0.02 / sqrt(2 x blocks), every other weight at 0.02 (uniform: its
    /// bound is sqrt(3) standard deviations).
    pub(super) fn fill(&self, name: &str) -> Fill {
        if name.ends_with(".bias") {
            Fill::Zero
        } else if name.starts_with("norm") || name.contains(".norm") {
            Fill::One
        } else if name.ends_with("attn.proj.weight") || name.ends_with("mlp.down.weight") {
            Fill::Uniform((0.02 * (3.0 / (2.0 * self.layers as f64)).sqrt()) as f32)
        } else {
            Fill::Uniform((0.02 * 3f64.sqrt()) as f32)
        }
    }
}

/// How a variable starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fill {
    /// All zero.
    Zero,
    /// All one.
    One,
    /// Uniform on `[-bound, bound]`.
    Uniform(f32),
}

/// A LayerNorm's scale and shift.
#[derive(Debug)]
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn new(width: usize, vb: VarBuilder<'_>) -> candle_core::Result<Norm> {
        Ok(Norm {
            weight: vb.get(width, "weight")?,
            bias: vb.get(width, "bias")?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5)
    }
}

/// One pre-norm transformer block.
#[derive(Debug)]
struct Block {
    norm1: Norm,
    qkv: Linear,
    proj: Linear,
    norm2: Norm,
    up: Linear,
    down: Linear,
}

/// The transformer.
#[derive(Debug)]
pub(super) struct Gpt {
    shape: GptShape,
    token: Embedding,
    position: Tensor,
    blocks: Vec<Block>,
    norm: Norm,
    head: Linear,
    /// `[context, context]`: 0 where a position may attend, -inf after it.
    mask: Tensor,
}

impl Gpt {
    /// The model's variables, made in `vb` (their values are drawn later).
    pub(super) fn new(shape: GptShape, vb: VarBuilder<'_>) -> candle_core::Result<Gpt> {
        let d = shape.width;
        let mut blocks = Vec::with_capacity(shape.layers);
        for k in 0..shape.layers {
            let vb = vb.pp(format!("blocks.{k}"));
            blocks.push(Block {
                norm1: Norm::new(d, vb.pp("norm1"))?,
                qkv: candle_nn::linear(d, 3 * d, vb.pp("attn.qkv"))?,
                proj: candle_nn::linear(d, d, vb.pp("attn.proj"))?,
                norm2: Norm::new(d, vb.pp("norm2"))?,
                up: candle_nn::linear(d, 4 * d, vb.pp("mlp.up"))?,
                down: candle_nn::linear(4 * d, d, vb.pp("mlp.down"))?,
            });
        }
        let t = shape.context;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Gpt {
            shape,
            token: candle_nn::embedding(VOCAB, d, vb.pp("token"))?,
            position: vb.get((t, d), "position")?,
            blocks,
            norm: Norm::new(d, vb.pp("norm"))?,
            head: candle_nn::linear(d, VOCAB, vb.pp("head"))?,
            mask: Tensor::from_vec(mask, (t, t), &Device::Cpu)?,
        })
    }

    /// Characters per window.
    pub(super) fn context(&self) -> usize {
        self.shape.context
    }

    /// The logits `[n * t, VOCAB]` of every position of `tokens` (`[n, t]`
    /// u32, `t` at most the context).
    pub(super) fn forward(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (n, t) = tokens.dims2()?;
        let (d, heads) = (self.shape.width, self.shape.heads);
        let head_dim = d / heads;
        let position = self.position.narrow(0, 0, t)?;
        // The residual stream, one row per position: [n * t, d].
        let mut h = self
            .token
            .forward(tokens)?
            .broadcast_add(&position)?
            .reshape((n * t, d))?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let scale = 1.0 / (head_dim as f64).sqrt();
        for block in &self.blocks {
            // [n, 3 * heads, t, head_dim] (a view): queries, keys, values
            // by head, each made contiguous once below.
            let qkv = block
                .qkv
                .forward(&block.norm1.forward(&h)?)?
                .reshape((n, t, 3 * heads, head_dim))?
                .transpose(1, 2)?;
            let q = qkv.narrow(1, 0, heads)?.contiguous()?;
            let k = qkv.narrow(1, heads, heads)?.contiguous()?;
            let v = qkv.narrow(1, 2 * heads, heads)?.contiguous()?;
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
            let attention = candle_nn::ops::softmax(&scores, D::Minus1)?;
            let mixed = attention
                .matmul(&v)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((n * t, d))?;
            h = (h + block.proj.forward(&mixed)?)?;
            let up = block.up.forward(&block.norm2.forward(&h)?)?.gelu()?;
            h = (h + block.down.forward(&up)?)?;
        }
        self.head.forward(&self.norm.forward(&h)?)
    }
}
