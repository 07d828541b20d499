"""The patterns by which ``extract.attributes`` reads what a person says of themselves: whose
clause it is (someone else's, the speaker's), how sure (a hedge, a doubt, a plan, a visit), what
it does to a value (an ending, an addition, a correction, a change that names the old value),
and the frames a value stands in ("I'm now at X", "my usual is Y", "I take the Z to work").
"""

from __future__ import annotations

import re

from mnemoplan.extract.attribute_kinds import FAVOURITE_WORD

RELATIONS = (r"brother|sister|friend|best friend|mum|mom|mother|dad|father|son|daughter|kid|kids|child|"
             r"parents?|aunt|uncle|cousin|grandma|grandpa|grandmother|grandfather|neighbou?r|colleague|coworker|"
             r"boss|roommate|flatmate|housemate|girlfriend|boyfriend|wife|husband|partner|fianc[ée]e?|sis|bro|"
             r"mate|best mate|bestie|pal|buddy|classmate|niece|nephew")
OTHER_SUBJECT = re.compile(rf"\b(?:my|our|her|his|their)\s+(?:\w+\s+)?(?:{RELATIONS})(?:'s)?\b|"
                           r"\b(?:he|she|they)\b(?!'s a )", re.I)
FIRST_PERSON = re.compile(r"\b(?:i|i'm|im|i've|i'd|i'll|me|my|we|we're|we've|our|us|mine)\b", re.I)
SUBJECT_I = re.compile(r"\b(?:i|i'm|im|i've|i'd|i'll|we|we're|we've)\b", re.I)
DENIED = re.compile(r"\b(?:don't|dont|do not|doesn't|does not|didn't|did not|never|not|no longer|isn't|aren't|"
                    r"wasn't|weren't|won't|can't|cannot)\b", re.I)
# Doubt about the whole sentence, wherever it is said ("I think I moved to Porto, not sure")
UNSURE = re.compile(r"\b(?:not sure|i think|i guess|i believe|probably|possibly|unsure|not certain|kinda|sort of)\b",
                    re.I)
HEDGE = re.compile(r"\b(?:maybe|might|perhaps|thinking (?:about|of)|considering|consider|wonder\w*|would|"
                   r"if i|if we|someday|some day|one day|plan(?:ning)? to|want to|wanna|hope to|hoping to|dream\w*|"
                   r"not sure|should i|could i|tempted|might|applying|apply|offered|interview\w*|when i'm|when i am|"
                   r"when i turn|once i'm|once i turn|by the time i|i'd|we'd|in another life|if only)\b", re.I)
# words by which a statement tells of a change ("my new Kia", "switched to", "now at"), or one message
# naming two values of an attribute tells which replaced which
CHANGE = re.compile(r"\b(?:replac\w+|switch\w*|swapp?\w*|trad(?:e|ed|ing)|instead|upgrad\w+|chang\w+|now|new|no longer|"
                    r"anymore|any more|left|sold|ditched|moved|from|got|bought|since|finally|started|joined|"
                    r"sorry|oops|i meant|actually|correction)\b", re.I)
# a change the speaker tells of, in a sentence that names a value only by its kind
MOVED_ON = re.compile(r"\b(?:i|we)\s+(?:\w+\s+)?(?:switched|moved|changed|joined)\b|\b(?:the|my|our)\s+new\b", re.I)
# A plan that did not happen, or a thing tried and not kept: the sentence states nothing of the speaker
# ("we were supposed to move to X", "almost bought a Y", "ordered a Z and sent it back")
UNREALISED = re.compile(r"\b(?:(?:was|were)\s+(?:going|supposed|about|meant|planning|hoping)\s+to|supposed to|almost|"
                        r"nearly|tried to|test[- ]?dr(?:ove|ive|iving|iven)|turned (?:it |them |that |the \w+ )?down|"
                        r"sent (?:it |them )?back|returned it|never (?:went|happened|did|started|showed|used)|"
                        r"fell through|didn't (?:happen|work out|go through)|backed out|free trial|trial (?:at|of|with))\b",
                        re.I)
# Words said, not claims held: a quotation after a verb of saying, or one that speaks ("I live in
# London now!", "is Coldplay your favourite band?"); a quoted title ("Piranesi") stays a value.
SPOKEN = re.compile(r"[\"“](?P<q>[^\"”]{1,200})[\"”]")
SAYS = re.compile(r"\b(?:say|says|said|saying|ask|asks|asked|asking|joke[sd]?|joking|text(?:s|ed)?|wrote|writes|goes|"
                  r"announc\w*|told|tells|yell\w*|shout\w*|repl(?:y|ied|ies)|call(?:s|ed)? me|sings?|sang)\W*$", re.I)
# the speaker's own taking or use of a thing a name's kind gives away: "bought a Mazda", "I bank with
# Monzo", "I'm on a Fairphone 5", "we've had HBO Max", "I see Dr. Ivanova", "my internet's with X"
_DET = r"(?:(?:a|an|the|my|our|new|brand new|second-hand|used|shiny|dr\.?)\s+)*$"
SPEAKER_HAS = re.compile(r"\b(?:got|bought|switched to|picked up|went with|joined|upgraded to|changed to|started at|"
                         r"signed up (?:with|at|for)|moved to|gave me|got me|sent me)\s+" + _DET + "|"
                         r"\b(?:i|we|i'm|im|we're|i've|we've|i am|we are)\s+(?:\w+\s+){0,3}?(?:have|had|use|using|"
                         r"drive|driving|own|run in|running in|wear|wearing|see|go to|going to|doing|train(?:ing)? at|"
                         r"bank(?:ing)? with|meant|on|at|with)\s+" + _DET + "|"
                         r"\b(?:my|our)\s+(?:\w+\s+){0,2}?\w+(?:'s|’s|\s+is|\s+are)\s+(?:now\s+)?(?:with\s+|on\s+|at\s+)?"
                         + _DET, re.I)
VISIT = re.compile(r"\b(?:back from|trip|holiday|vacation|visit\w*|travel\w*|workshop|conference|was in|were in|"
                   r"went to|spent (?:the|a|two|three|\w+) (?:whole )?(?:week|weekend|days?|month)|rented|rental|"
                   r"loaner|borrow\w*|in the meantime|for now|temporar\w*|repair shop|for the (?:weekend|week)|"
                   r"tried|tasting|sample\w*|had to|during the|for (?:a|one|two|three|four|five|a few|\d+) "
                   r"(?:days?|nights?|weeks?))\b", re.I)
ENDING = re.compile(r"\b(?:not (?:\w+ ){0,3}(?:anymore|any more)|no longer|sold|quit|quitting|retired|"
                    r"broke up|broken up|split up|divorced|left|leaving|cancel+ed|cancel|gave up|given up|stopped|"
                    r"rehomed|rehome|passed away|passed|died|lost|stolen|laid off|let go|fired|graduated|"
                    r"finished (?:uni|school|my degree|university)|last day|moved out|ended|closed|unsubscribed|"
                    r"said goodbye|without a|no more|car-free|have no|got no|no \w+ at all|gave (?:away )?(?:my|our|the)|don't have (?:a|an|any)|do not have|got rid of|"
                    r"dropped|shut off|shut down|not a \w+ anymore|is gone|are gone|is on hold|on hold|"
                    r"is (?:ancient )?history|is over|switched from|moved on from)\b", re.I)
ADD = re.compile(r"\b(?:also|too(?=\s*(?:[,.!?;]|lol|haha|$))|as well|second|another|both|two(?! (?:weeks|days|months|years|hours|minutes))|on the side|in addition|plus|additional|"
                 r"extra|as a side|beside|besides|and my work)\b", re.I)
# "KPMG, not Deloitte"; not "not my favourite food", which names an attribute, not a value
NOT_X = re.compile(r"\bnot\s+(?!(?:my|our|your|his|her|their)\b)(?:the\s+|a\s+|an\s+)?(?P<old>[^,.!?;]+?)(?=\s*(?:[,.!?;—–-]|$|\banymore\b))", re.I)
ENDED_NAME = re.compile(r"\b(?:sold|quit|left|cancel+ed|closed|dropped|ditched|gave up|switched from|moved on from|"
                        r"moved out of|replaced|instead of)\s+(?:(?:the|my|our|a|an|of)\s+){0,2}$", re.I)
INSTEAD = re.compile(r"\binstead of\s+(?:the\s+|my\s+)?", re.I)
FROM_TO = re.compile(r"\bfrom\s+(?P<old>[^,.!?;]+?)\s+to\s+(?P<new>[^,.!?;]+)", re.I)
# What may stand between a cue and its value: "work at", "moved to the", "my dog, Moose", "drive a 2012"
GAP = re.compile(r"[\s,:\-–]*(?:(?:at|in|to|for|with|from|on|is|are|was|named|called|now|the|a|an|my|our|new|old|"
                 r"little|current|two|of|by|into|as|over|here|there|\d+|dr\.?|mr\.?|ms\.?|mrs\.?)\b[\s,:\-–]*){0,4}",
                 re.I)
RELATION_CUE = re.compile(r"girlfriend|boyfriend|wife|husband|partner|fianc[ée]e?|spouse|pet|dog|cat|kitten|puppy|"
                          r"hamster|guinea pig|rabbit|parrot|goldfish|bird|tortoise|turtle", re.I)
AT_FRAME = re.compile(r"(?:\b(?:i'm|i am|im|now|we're)\s+(?:now\s+)?(?:at|with|on)|\b(?:joined|switched to|"
                      r"upgraded to|changed to|started at|transferred to|went with|signed up (?:with|for|at)|"
                      r"went over to|now with))\s+(?:the\s+)?$", re.I)
IN_FRAME = re.compile(r"\b(?:i'm|i am|im|we're|we are|now)\s+(?:now\s+)?(?:in|based in|living in)\s+$", re.I)
# "my new iPhone 13", "our old Rogers": what stands right after "my" is the speaker's own
OWNED = re.compile(r"\b(?:my|our)\s+(?:(?:new|old|current|little|trusty|brand new|first)\s+)*$", re.I)
# Nouns that name a lower-case value in "my N is V" / "V is my N" (the value is no name)
COPULA_NOUNS = {"hobby": "hobbies", "pastime": "hobbies", "passion": "hobbies", "usual": "coffee_order",
                "go-to": "coffee_order", "order": "coffee_order", "drink": "coffee_order"}
COPULA = re.compile(r"\bmy\s+(?:(?:main|usual|new|current|coffee|big|favou?rite|only|real)\s+)?(?P<noun>hobby|pastime|passion|"
                    r"usual|go-to|order|drink)\s+(?:now\s*)?(?:is|=|:)\s+(?:now\s+)?(?:an?\s+|the\s+)?(?P<v>[^,.!?;:()]+)|"
                    r"(?:^|[,;]\s*)(?P<v2>[a-z][\w\s-]{1,30}?)\s+(?:is|has become)\s+(?:now\s+)?my\s+(?:(?:main|new|only|"
                    r"big|real)\s+)?(?P<noun2>hobby|pastime|passion|go-to|drink)\b", re.I)
# Chat drops the "I": "finally sold the Civic and bought a Mazda", "switched to Chennai Super Kings"
IMPLIED_I = re.compile(r"(?:(?:ok|okay|so|well|and|also|finally|just|recently|officially|big news:?|update:?)[\s,!]+)*"
                       r"(?:got|bought|sold|left|quit|joined|switched|moved|started|began|took up|swapped|traded|"
                       r"changed|upgraded|replaced|finished|adopted|signed up|ditched|dropped|gave up)\b", re.I)
QUESTION_WORD = re.compile(r"(?:what|how|which|is|are|should|can|could|do|does|did|where|who|why|when|will|would|"
                           r"shall|may|might|has|have|any|anyone)\b", re.I)
ASKS = re.compile(r"[,;:]\s+(?:(?:and|so|but|or|ok)\s+)?" + QUESTION_WORD.pattern, re.I)
TAKE_TO_WORK = re.compile(r"\b(?:i|we)\s+(?:\w+\s+)?(?:take|ride|catch|get)\s+(?:the\s+|a\s+|an\s+)?"
                          r"(?P<v>[\w+-]+(?:\s+[\w+-]+)?)\s+(?:to|into)\s+(?:work|the office)\b", re.I)
# a favourite of a kind memory keeps no slot for ("favourite character", "favourite colour")
OTHER_FAVOURITE = re.compile(FAVOURITE_WORD + r"\s+(?!(?:is|are|was|now|has|had|ever|of|too|by|and|but|so|lol|haha|"
                             r"though|tho|at|for|in|on|right|these|this|atm|again)\b)[a-z]+", re.I)
# whose a partner or pet is: "my girlfriend", "our cat", "the new kitten", "we got a hamster"
OWNER = re.compile(r"\b(?:my|our|new)\s+(?:\w+\s+)?$|\b(?:a|the)\s+(?:\w+\s+)?new\s+$|"
                   r"\b(?:got|adopted|have|bought|rescued)\s+(?:a|an|the)\s+(?:\w+\s+)?$", re.I)
# attributes whose value may stand right before the cue, a service's or a thing's name
NAMED_BEFORE = frozenset({"internet_provider", "bank", "gym", "phone", "laptop", "car", "streaming_service"})
PLACES = ("home_city", "neighbourhood")  # attributes whose values are places
UNNAMED = frozenset({"job_title", "diet", "hair_colour", "commute", "age", "email", "phone_number", "languages",
                     "coffee_order"})
QUOTED = re.compile(r"\b(?:i|we)\s+(?:\w+\s+)?(?:say|said|typed|wrote|misread|mix(?:ed)? up|confus\w*|swap\w*)\b|"
                    r"\bautocorrect\w*", re.I)
GONE = re.compile(r"(?:^|[,;]\s*)(?:(?:and|so|but|ok|well)\s+)?(?:the\s+|my\s+)?[\w'’.+-]+(?:\s+[\w'’.+-]+){0,3}\s+(?:is|are)\s+"
                  r"(?:gone|on hold|(?:ancient )?history|over|dead to me|done)\b", re.I)
NO_VALUE = re.compile(r"(?:the )?(?:one|ones|it|that|this|these|those|what|which|yours?|mine)\b", re.I)
CORRECTION = re.compile(r"(?:(?:oh|oops|wait|hmm|hang on|well|sorry)[\s,!.—-]+)*(?:no|nope|oops|my bad|actually)[\s,!.—-]+"
                        r"(?:(?:no|sorry|wait|actually|i mean|i meant)[\s,!.—-]+)*(?:(?:it's|its|it is|they're|"
                        r"they are|he's|she's|i meant|i mean)\s+)?(?:the\s+|a\s+|an\s+)?(?P<v>[^,.!?;—]{1,40}?)"
                        r"\s*(?:[,.!?;—]|$)", re.I)
SENTENCE = re.compile(r"(?<=[.!?;])(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bSt\.)\s+|\n+|\s+[—–]\s+|\s+-\s+")

SAYING = re.compile(r"^(?:(?:oh|oops|wait|no|sorry|hmm|actually|nooo+|ok|so|well|hang on)\W*\s*)*"
                    r"(?:(?:it's|it is|its|he's|she's|he is|she is|they're|i'm|i am|my \w+ is|that's)\s+)?"
                    r"(?:(?:a|an|the|actually|really)\s+)*", re.I)
FUTURE = re.compile(r"\b(?:i'll|we'll|i will|we will|going to|gonna)\b", re.I)
PAST = re.compile(r"\b(?:was|were|used to|before|previous(?:ly)?|former(?:ly)?|back then|ex)\b", re.I)
PLACE_BEFORE = re.compile(r"\b(?:in|to|from|near|around|via)\s+(?:the\s+)?$", re.I)
# what stands between a name and the noun it is set beside: "Frida, our new kitten"
APPOSED = re.compile(r"\s*,\s*(?:(?:my|our|the|a|an|his|her|their|new|little|old|sweet|first|second|lovely)\s+){0,3}",
                     re.I)
# a name after "with" is company, not a value: "walked the dog with Emma", "lunch with Tom"
COMPANION = re.compile(r"\bwith\s+(?:the\s+)?$", re.I)


def unquoted(text: str) -> str:
    """The text without the words it quotes someone saying (blanked, so positions hold): "my niece
    keeps saying "I live in London now!"", "the barista wrote "latte" on my cup". A quoted title
    ("my favourite book is "Piranesi"") stays."""
    def blank(m: re.Match[str]) -> str:
        spoken = (SAYS.search(text[max(0, m.start() - 30):m.start()]) or FIRST_PERSON.search(m.group("q"))
                  or re.search(r"\byou(?:r|'re)?\b|[?!]\s*$", m.group("q"), re.I))
        return " " * len(m.group()) if spoken else m.group()
    return SPOKEN.sub(blank, text)


def doctor_named(sentence: str, cues: list[tuple[int, int, str]]) -> bool:
    """Whether a sentence speaks of a doctor by more than a title ("my GP", "the dentist")."""
    return any(a == "doctor" and not re.fullmatch(r"dr\.?", sentence[i:j], re.I) for i, j, a in cues)
