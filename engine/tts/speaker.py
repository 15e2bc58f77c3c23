"""A Base model's speaker encoder: a recording at 24 kHz -> log-mel spectrogram -> ECAPA-TDNN -> one vector (the
"x-vector") that stands in the talker's prompt where a CustomVoice model puts a speaker's embedding.

Weights are the checkpoint's `speaker_encoder.*` tensors; module attribute names equal those keys (without the
prefix), so loading is strict. The math follows qwen_tts's mel_spectrogram, Qwen3TTSSpeakerEncoder and
extract_speaker_embedding, and equals them on the same weights (tests/tts/test_clone.py); the network is the one of
"ECAPA-TDNN: Emphasized Channel Attention, Propagation and Aggregation in TDNN Based Speaker Verification"
(Desplanques et al., 2020, https://arxiv.org/abs/2005.07143).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.tts.checkpoint import load_weights
from engine.tts.config import SpeakerEncoderConfig

# The mel the official extract_speaker_embedding computes, with these values written in its code (not in
# config.json): 1024-sample windows (43 ms at 24 kHz) every 256 samples (10.7 ms), 128 Slaney mel bins up to 12 kHz.
N_FFT = 1024
HOP_SAMPLES = 256
F_MAX_HZ = 12_000
_LOG_FLOOR = 1e-5  # mel energies are clamped to this before the log (-11.5)
_MAGNITUDE_EPSILON = 1e-9  # added to |STFT|^2 before the square root
_STATISTICS_EPSILON = 1e-12  # variances are clamped to this before the square root


def mel_filters(sample_rate_hz: int, mel_bins: int) -> torch.Tensor:
    """(mel_bins, N_FFT // 2 + 1) float32: librosa.filters.mel's default filters (Slaney scale and area
    normalization) from 0 Hz to F_MAX_HZ, as the official code builds them."""
    from transformers.audio_utils import mel_filter_bank  # a main dependency; imported with the model

    bank = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=mel_bins, min_frequency=0.0,
                           max_frequency=F_MAX_HZ, sampling_rate=sample_rate_hz, norm="slaney", mel_scale="slaney")
    return torch.from_numpy(bank.T).float()


def log_mel(audio: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """(samples,) float32 in [-1, 1] -> (frames, mel_bins) natural-log mel energies, frames = samples // 256 + 1."""
    # reflect-padded by (window - hop) / 2 on each side, so frame i is centred on sample i * hop + hop / 2
    pad = (N_FFT - HOP_SAMPLES) // 2
    padded = F.pad(audio[None, None], (pad, pad), mode="reflect")[0, 0]
    window = torch.hann_window(N_FFT, device=audio.device)
    spectrum = torch.stft(padded, N_FFT, hop_length=HOP_SAMPLES, window=window, center=False, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spectrum).pow(2).sum(-1) + _MAGNITUDE_EPSILON)  # (bins, frames)
    return torch.log(torch.clamp(filters @ magnitude, min=_LOG_FLOOR)).T


class TDNN(nn.Module):
    """A time-delay layer: a dilated 1-D convolution, length kept by reflect padding, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, padding="same",
                              padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Splits the channels into `scale` groups; group i > 0 goes through its own TDNN after adding group i-1's output
    (group 1 has nothing added, group 0 passes unchanged), so later groups see ever wider contexts."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int):
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        outputs = [groups[0]]
        for i, block in enumerate(self.blocks):
            outputs.append(block(groups[i + 1] if i == 0 else groups[i + 1] + outputs[-1]))
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Scales each channel by a gate in (0, 1) computed from all channels' means over time."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, bottleneck, 1)
        self.conv2 = nn.Conv1d(bottleneck, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    """TDNN (1x1), Res2Net, TDNN (1x1), squeeze-excitation, plus the block's input."""

    def __init__(self, in_channels: int, channels: int, cfg: SpeakerEncoderConfig, kernel_size: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(in_channels, channels, 1)
        self.res2net_block = Res2Net(channels, cfg.res2net_scale, kernel_size, dilation)
        self.tdnn2 = TDNN(channels, channels, 1)
        self.se_block = SqueezeExcitation(channels, cfg.se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _mean_std(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and standard deviation over time of x (B, C, T), weights (B, 1 or C, T) summing to 1."""
    mean = (weights * x).sum(2)
    variance = (weights * (x - mean[..., None]).pow(2)).sum(2)
    return mean, torch.sqrt(variance.clamp(min=_STATISTICS_EPSILON))


class AttentiveStatisticsPooling(nn.Module):
    """(B, C, T) -> (B, 2C, 1): mean and standard deviation over time, each frame weighted per channel by an
    attention that sees the frame and the whole recording's plain mean and standard deviation."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(3 * channels, attention_channels, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[2]  # frames
        mean, std = _mean_std(x, torch.full_like(x[:, :1], 1 / T))
        context = torch.cat((x, mean[..., None].expand_as(x), std[..., None].expand_as(x)), dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _mean_std(x, attention)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: a TDNN, SE-Res2Net blocks, their outputs joined by one more TDNN (multi-layer feature
    aggregation), attentive statistics pooling, and a 1x1 convolution to the embedding."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        c, k, d = cfg.channels, cfg.kernel_sizes, cfg.dilations
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, c[0], k[0], d[0])])
        for i in range(1, len(c) - 1):
            self.blocks.append(SERes2NetBlock(c[i - 1], c[i], cfg, k[i], d[i]))
        self.mfa = TDNN(sum(c[1:-1]), c[-1], k[-1], d[-1])
        self.asp = AttentiveStatisticsPooling(c[-1], cfg.attention_channels)
        self.fc = nn.Conv1d(2 * c[-1], cfg.enc_dim, 1)
        self.register_buffer("filters", mel_filters(cfg.sample_rate_hz, cfg.mel_dim), persistent=False)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """(B, frames, mel_dim) log-mel -> (B, enc_dim)."""
        x = mel.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))  # every SE-Res2Net block's output, not the first TDNN's
        return self.fc(self.asp(x))[..., 0]

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """A recording (samples,) float32 at cfg.sample_rate_hz, in [-1, 1] -> its embedding (enc_dim,) float32."""
        audio = audio.to(self.filters.device, torch.float32)
        return self(log_mel(audio, self.filters)[None])[0]


def load_speaker_encoder(folder: Path, cfg: SpeakerEncoderConfig, device="cpu") -> SpeakerEncoder:
    """The speaker encoder of a Base checkpoint folder, in float32 (it runs once per cloned voice, so precision
    costs nothing per utterance).

    Raises:
        ModelFilesError: the weights are missing, truncated or corrupt, or a `speaker_encoder.*` tensor is missing,
            unexpected or of a shape config.json does not describe.
    """
    with torch.device("meta"):
        encoder = SpeakerEncoder(cfg)  # its mel filters, not a weight, are made on the CPU all the same
    encoder = load_weights(encoder, folder, prefix="speaker_encoder.", device=device, dtype=torch.float32)
    encoder.filters = encoder.filters.to(device)
    return encoder
