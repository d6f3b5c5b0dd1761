"""Small hand-written word lists for the offline essay haystack and the needle keys.

Lowercase letters only (no digits, no hyphens), so needles, numbers and hyphenated
keys can never be confused with filler text.
"""


def _split(text: str) -> tuple[str, ...]:
  return tuple(text.split())


NAMES = _split("""
  Anna Tomas Maria Jonah Lena Oscar Clara Felix Nora Victor Ruth Samuel Elena Hugo Irene
  Martin Alice Daniel Helen Peter Sofia Leon Grace Arthur Julia Simon Laura Henry Ada Paul
""")

NOUNS = _split("""
  village river teacher garden market library bridge harbor orchard kitchen letter window
  farmer painter doctor student neighbor traveler captain baker engineer writer musician
  forest mountain valley island meadow road station factory school museum theater workshop
  lantern notebook basket ladder blanket kettle compass violin bicycle wagon carpet mirror
  question story promise lesson habit rumor problem journey decision argument memory plan
""")

ADJECTIVES = _split("""
  old quiet bright narrow heavy gentle careful curious patient stubborn distant familiar
  small large warm cold simple strange modest honest clever tired busy empty crowded calm
  wooden golden silent ancient ordinary sudden steady rough smooth pale dark early late
""")

VERBS_TRANSITIVE = _split("""
  built found carried painted repaired opened closed visited described noticed borrowed
  cleaned measured followed remembered forgot answered studied moved watched crossed sold
  bought explained questioned ignored collected planted discovered shared finished
""")

VERBS_INTRANSITIVE = _split("""
  waited laughed arrived rested wandered listened hesitated worked slept returned smiled
  traveled complained agreed paused stayed danced sang whispered shouted improved
""")

ADVERBS = _split("""
  slowly quietly carefully eagerly calmly happily patiently suddenly rarely often gladly
  openly gently firmly nervously proudly quickly politely softly honestly
""")

PLACES = (
    "near the old bridge", "by the river", "in the crowded market", "behind the library",
    "at the edge of the forest", "inside the small workshop", "on the narrow road",
    "under the wooden roof", "across the quiet valley", "beside the harbor",
    "in the back of the kitchen", "at the top of the hill", "along the empty station",
    "outside the museum", "in a corner of the garden", "between the two villages",
)

TIMES = (
    "that morning", "the next day", "every winter", "before the rain", "after dinner",
    "during the long summer", "late at night", "early in the spring", "once a week",
    "for many years", "by the end of the month", "on a cold evening", "at noon",
)

OPENERS = (
    "In the end", "Over the years", "Sometimes", "Later that day", "As a rule", "Even so",
    "For a while", "At first", "In those days", "Without a word", "By then", "Meanwhile",
    "To everyone's surprise", "Little by little", "Of course", "In any case",
)

CONNECTIVES = ("because", "although", "while", "since", "after", "before", "until", "when")

# Needle keys: RULER-style "adjective-noun" words (e.g. "curious-lantern"), 100 x 100.
KEY_ADJECTIVES = _split("""
  abundant adorable agreeable alert ambitious ancient anxious aquatic arctic ashamed
  bashful bitter blushing bold brave breezy brief bright brisk bumpy calm capable careful
  cheerful chilly clever cloudy clumsy colossal cool crisp curly curious damp dapper daring
  dazzling delicate dizzy drowsy dusty eager early elastic elegant energetic fancy fearless
  fierce flaky fluffy fragile frantic fresh friendly frosty fuzzy gentle giant gigantic
  glamorous gleaming glossy grumpy handsome hasty hollow humble icy jolly juicy lively
  lonely lucky majestic mellow mighty misty modern muddy mysterious nimble noisy odd
  orange plucky polite proud quaint quick quiet rapid rustic scarlet shiny silky sleepy
  spicy spotless sturdy sunny tender tidy tiny vivid wandering witty zany zealous
""")

KEY_NOUNS = _split("""
  anchor apple arch armchair badge balloon bamboo banjo barrel beacon beetle bell biscuit
  blossom boulder bracelet breeze brick bucket butter cabin cactus camel candle canoe
  canyon carrot castle cello cherry chimney cloud clover comet cookie coral cottage crayon
  crystal cushion daisy desert dolphin dragon drum eagle easel ember falcon feather fern
  fiddle flute fountain fox galaxy garnet geyser glacier goblet gravel guitar hammock
  harbor hedge helmet honey iceberg igloo jacket jasmine jungle kayak kettle kite lagoon
  lantern lemon lily lobster magnet maple marble meadow mitten moss nectar nest oasis
  oyster paddle pebble pepper piano pillow puddle quartz quill rabbit raft ribbon
""")
