// tokenizer/special_tokens.h: cuts the special tokens out of raw text before the text is
// tokenized, so "<|im_start|>user" becomes [<|im_start|>] + "user".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ember {

class Vocab;

// A piece of the input: either one special token or a byte range of plain text.
struct Fragment {
  int32_t token = -1;  // >= 0: this fragment is that token
  size_t begin = 0;    // otherwise: text[begin, end)
  size_t end = 0;
};

// Splits `text` into fragments. User-defined tokens are always cut out (Hugging Face treats
// added tokens that way); control and unknown tokens only when parse_special is true.
// Longer tokens are searched for first. A token with lstrip/rstrip also takes the ASCII
// whitespace before/after it.
std::vector<Fragment> split_special_tokens(const Vocab& vocab, std::string_view text, bool parse_special);

}  // namespace ember
