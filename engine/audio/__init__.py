"""Sound in and out through PortAudio (sounddevice): the Player speaks TTS chunks, the Microphone feeds the VAD, the
Recorder takes a voice sample.

Importing this package does not load PortAudio; opening a device does (and says how to install it).
"""

from engine.audio.devices import Device, find_device, list_devices
from engine.audio.microphone import MIC_RATE_HZ, CaptureStats, MicBlock, Microphone, MicrophoneOptions
from engine.audio.player import TTS_RATE_HZ, PlaybackStats, Player, PlayerOptions, UtteranceStarted
from engine.audio.recorder import Recorder

__all__ = [
    "MIC_RATE_HZ",
    "TTS_RATE_HZ",
    "CaptureStats",
    "Device",
    "MicBlock",
    "Microphone",
    "MicrophoneOptions",
    "PlaybackStats",
    "Player",
    "PlayerOptions",
    "Recorder",
    "UtteranceStarted",
    "find_device",
    "list_devices",
]
