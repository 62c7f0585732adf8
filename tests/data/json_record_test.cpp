// Tests of the C4 JSON record parser: escapes, surrogate pairs, skipped values, malformed lines.
#include "data/json_record.h"

#include <gtest/gtest.h>

namespace darkformer {
namespace {

JsonRecordStatus Parse(const std::string& line, std::string* text) { return ParseC4Record(line, text); }

TEST(JsonRecordTest, ParsesAC4Record) {
  std::string text;
  ASSERT_EQ(Parse(R"({"text":"Hello, world.","timestamp":"2019-04-25T12:57:54Z","url":"https://x.org/a"})", &text),
            JsonRecordStatus::kOk);
  EXPECT_EQ(text, "Hello, world.");
}

TEST(JsonRecordTest, DecodesEveryEscape) {
  std::string text;
  ASSERT_EQ(Parse(R"({"text":"a\"b\\c\/d\be\ff\ng\rh\ti"})", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "a\"b\\c/d\be\ff\ng\rh\ti");
}

TEST(JsonRecordTest, DecodesUnicodeEscapesToUtf8) {
  std::string text;
  ASSERT_EQ(Parse(R"({"text":"caf\u00e9 \u20AC \u0041"})", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "caf\xC3\xA9 \xE2\x82\xAC A");
  // U+1F600 as a surrogate pair.
  ASSERT_EQ(Parse(R"({"text":"\ud83d\ude00!"})", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "\xF0\x9F\x98\x80!");
}

TEST(JsonRecordTest, LoneSurrogatesAreMalformed) {
  // nlohmann::json refuses UTF-16 escapes that do not form a code point; such a record is skipped
  // and counted as malformed rather than decoded with replacement characters.
  std::string text, error;
  EXPECT_EQ(ParseC4Record(R"({"text":"a\ud83db"})", &text, &error), JsonRecordStatus::kMalformed);
  EXPECT_NE(error.find("at byte"), std::string::npos);
  EXPECT_EQ(Parse(R"({"text":"\ude00"})", &text), JsonRecordStatus::kMalformed);
}

TEST(JsonRecordTest, ATextKeyReboundToANonStringIsNoText) {
  std::string text;
  EXPECT_EQ(Parse(R"({"text":"a","text":{"x":1}})", &text), JsonRecordStatus::kNoText);
  EXPECT_EQ(Parse(R"({"text":[1],"text":"b"})", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "b");
}

TEST(JsonRecordTest, PassesRawUtf8Through) {
  std::string text;
  ASSERT_EQ(Parse("{\"text\":\"na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\"}", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC");
}

TEST(JsonRecordTest, SkipsOtherValuesOfAnyType) {
  std::string text;
  ASSERT_EQ(Parse(R"( { "n": -1.5e+3, "z": 0, "b": [true, false, null, {"x": [1, "\u0041"]}], "o": {},)"
                  R"( "text" : "ok" , "after": [] } )",
                  &text),
            JsonRecordStatus::kOk);
  EXPECT_EQ(text, "ok");
}

TEST(JsonRecordTest, LastTextWinsAndCrlfIsAccepted) {
  std::string text;
  ASSERT_EQ(Parse("{\"text\":\"first\",\"text\":\"second\"}\r", &text), JsonRecordStatus::kOk);
  EXPECT_EQ(text, "second");
}

TEST(JsonRecordTest, RecordsWithoutStringTextAreNoText) {
  std::string text;
  EXPECT_EQ(Parse(R"({"url":"https://x.org"})", &text), JsonRecordStatus::kNoText);
  EXPECT_EQ(Parse(R"({"text":42})", &text), JsonRecordStatus::kNoText);
  EXPECT_EQ(Parse(R"({"text":null})", &text), JsonRecordStatus::kNoText);
  EXPECT_EQ(Parse(R"({})", &text), JsonRecordStatus::kNoText);
  EXPECT_EQ(Parse(R"({"meta":{"text":"nested does not count"}})", &text), JsonRecordStatus::kNoText);
}

TEST(JsonRecordTest, BlankLinesAreBlank) {
  std::string text;
  EXPECT_EQ(Parse("", &text), JsonRecordStatus::kBlank);
  EXPECT_EQ(Parse(" \t\r", &text), JsonRecordStatus::kBlank);
}

TEST(JsonRecordTest, MalformedLinesAreMalformed) {
  const char* kBad[] = {
      R"({"text":"unterminated)",
      R"({"text":"x"} trailing)",
      R"({"text":"x",})",
      R"({"text" "x"})",
      R"({'text':'x'})",
      R"({"text":"bad \q escape"})",
      R"({"text":"short \u12"})",
      R"({"text":"bad hex \u12G4"})",
      "{\"text\":\"raw\ttab\"}",
      "{\"text\":\"raw\nnewline\"}",
      R"(["text","x"])",
      R"("just a string")",
      R"({"text":"x","n":01})",
      R"({"text":"x","n":1.})",
      R"({"text":"x","n":-})",
      R"({"text":"x","b":tru})",
      R"({"text":"x","a":[1,]})",
      R"({"text":"x")",
      R"({"text":"x"}})",
  };
  for (const char* line : kBad) {
    std::string text, error;
    EXPECT_EQ(ParseC4Record(line, &text, &error), JsonRecordStatus::kMalformed) << line;
    EXPECT_NE(error.find("at byte"), std::string::npos) << line;
  }
}

TEST(JsonRecordTest, RefusesDeepNesting) {
  std::string line = "{\"text\":\"x\",\"deep\":" + std::string(1000, '[') + std::string(1000, ']') + "}";
  std::string text;
  EXPECT_EQ(Parse(line, &text), JsonRecordStatus::kMalformed);
}

}  // namespace
}  // namespace darkformer
