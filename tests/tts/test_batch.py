"""Utterances decoded together (Qwen3TTS.sample_frames, advance_frames): each steps as it does alone, whenever it
joins or leaves the batch.

Both runs are stepped through the same frames (a Tape picks the codes of a free run of the utterance alone), so
what they hand their samplers, every codebook's logits, can be compared frame by frame.
"""

import pytest
import torch

from engine.tts import load_tts
from engine.tts.sampling import Sampler
from tests.tts.test_cpu import needs_int8

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# prompts of different lengths, so that the caches of one batch stand at different positions
TEXTS = [("Hello there, how are you today?", "ryan"),
         ("A second and longer sentence, with more words to say.", "serena"),
         ("Short.", "vivian")]
FRAMES = 12
JOINS = [0, 0, 3]  # the frame of the batch at which each utterance begins
ENDS = [FRAMES, 5, FRAMES]  # the frames each utterance has: the second leaves the batch early


class Tape:
    """A sampler that keeps the logits it is handed. With `forced` codes (frames, 16) it picks them instead of
    sampling, and EOS after the last."""

    def __init__(self, tts, seed: int, forced: torch.Tensor | None = None):
        talker = tts.config.talker
        self.sampler = Sampler(tts.default_sampling, seed, talker.decoder.vocab_size, talker.codec_eos_id,
                               tts._suppress)
        self.eos_id, self.forced, self.logits = talker.codec_eos_id, forced, []

    def talker(self, logits, frame):
        self.logits.append(logits.float().cpu())
        if self.forced is None:
            return self.sampler.talker(logits, frame)
        return self.forced[frame, 0] if frame < len(self.forced) else torch.tensor(self.eos_id, device=logits.device)

    def predictor(self, logits, frame, group):
        self.logits.append(logits.float().cpu())
        return self.sampler.predictor(logits, frame, group) if self.forced is None else self.forced[frame, group]


def begin(tts, index: int):
    text, speaker = TEXTS[index]
    inputs = tts.prompts.build(tts.prompts.text_ids(text), tts.resolve_voice(speaker), True, tts.device)
    return inputs, tts.model.begin(inputs.prefill.to(tts.dtype), FRAMES + 1)


def alone(tts, index: int, forced: torch.Tensor | None = None) -> tuple[Tape, torch.Tensor]:
    """Utterance `index` stepped by itself: its tape and its frames' codes (frames, 16)."""
    tape, (inputs, state), codes = Tape(tts, index, forced), begin(tts, index), []
    while state.frame < FRAMES and (frame := tts.model.sample_frame(state, tape)) is not None:
        codes.append(frame)
        tts.model.advance(state, frame, inputs.text_input(state.frame))
    return tape, torch.stack(codes)


def together(tts, forced: list[torch.Tensor]) -> list[Tape]:
    """Every utterance stepped in one batch through its forced codes, joining at JOINS; their tapes."""
    tapes, jobs = [Tape(tts, i, codes) for i, codes in enumerate(forced)], {}
    for step in range(max(JOINS) + FRAMES + 1):
        jobs |= {i: begin(tts, i) for i, join in enumerate(JOINS) if join == step}
        going = [i for i in jobs if jobs[i][1].frame < FRAMES]
        frames = tts.model.sample_frames([jobs[i][1] for i in going], [tapes[i] for i in going])
        going, frames = [i for i, f in zip(going, frames) if f is not None], [f for f in frames if f is not None]
        tts.model.advance_frames([jobs[i][1] for i in going], frames,
                                 [jobs[i][0].text_input(jobs[i][1].frame) for i in going])
        for i in set(jobs) - set(going):
            del jobs[i]
    return tapes


def largest_difference(tape: Tape, reference: Tape) -> float:
    assert len(tape.logits) == len(reference.logits)
    return max((a - b).abs().max().item() for a, b in zip(tape.logits, reference.logits))


@pytest.mark.parametrize("size", ["tiny", "tiny17"])
def test_each_utterance_of_a_batch_steps_as_it_does_alone(size, tiny_checkpoint, tiny17_checkpoint):
    """float32, both model shapes (the 1.7B's projection into the narrower code predictor too): three utterances at
    different positions, one joining the batch three frames late and one leaving it after five frames, get logits
    equal to their own runs alone but for the order of float sums (1e-4; seen: ~4e-6)."""
    tts = load_tts({"tiny": tiny_checkpoint, "tiny17": tiny17_checkpoint}[size], precision="float32")
    runs = [alone(tts, i) for i in range(len(TEXTS))]
    forced = [codes[:end] for (_, codes), end in zip(runs, ENDS)]
    solo = [alone(tts, i, codes)[0] for i, codes in enumerate(forced)]
    for i, (tape, reference) in enumerate(zip(together(tts, forced), solo)):
        # 16 codebooks a frame, and one more codebook 0 where EOS ended the utterance before FRAMES
        assert len(tape.logits) == ENDS[i] * 16 + (ENDS[i] < FRAMES), f"utterance {i}"
        assert largest_difference(tape, reference) < 1e-4, f"utterance {i}"


@needs_int8
def test_in_int8_a_batch_costs_no_more_than_int8_itself(tiny_checkpoint):
    """int8 products quantize their input with one scale for all its rows, so a batch's rows round otherwise than
    each alone: no further from their runs alone than int8 is from float32 (seen: 0.19 and 0.19 on logits of unit
    spread)."""
    tts, exact = load_tts(tiny_checkpoint, precision="int8"), load_tts(tiny_checkpoint, precision="float32")
    forced = [alone(tts, i)[1][:end] for i, end in enumerate(ENDS)]
    for i, tape in enumerate(together(tts, forced)):
        solo, reference = alone(tts, i, forced[i])[0], alone(exact, i, forced[i])[0]
        assert largest_difference(tape, solo) <= 2 * largest_difference(solo, reference), f"utterance {i}"


@needs_cuda
def test_on_the_gpu_kernels_of_one_sequence_serve_a_batch_one_by_one(tiny_checkpoint):
    """With the megakernel attached (its step and the CUDA attention prologue take one sequence a call), a batch runs
    its utterances' stacks one after the other, each as alone. Only the heads' products take the batch's rows at once,
    and cuBLAS may sum them in another order: every logit within two bfloat16 steps of its value alone."""
    tts = load_tts(tiny_checkpoint, device="cuda")
    forced = [alone(tts, i)[1][:end] for i, end in enumerate(ENDS)]
    for i, tape in enumerate(together(tts, forced)):
        reference = alone(tts, i, forced[i])[0]
        scale = max(logits.abs().max().item() for logits in reference.logits)
        assert largest_difference(tape, reference) <= scale / 64, f"utterance {i}"
