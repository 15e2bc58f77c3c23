"""How an utterance's frames are cut into the chunks it is heard in."""

# Codec frames per chunk after a segment's first chunks (TTSEngine.stream's chunk_frames).
CHUNK_FRAMES = 4
# A segment's first chunks are one frame each. The first is the earliest audio there can be; with the second, a
# player holds two frames (160 ms), enough to start on while the next chunk is made: a player that waits for more
# than one frame before it starts (Parley's waits for 120 ms) would otherwise wait for a whole longer chunk.
SINGLE_FRAMES = 2


def chunk_size(made: int, chunk_frames: int = CHUNK_FRAMES) -> int:
    """Frames of the chunk that follows the `made` first frames of a segment."""
    return 1 if made < SINGLE_FRAMES else chunk_frames
