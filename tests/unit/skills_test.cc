// Skills without a server: SKILL.md's front matter, the checks of a registration, the prompt's
// index, and the copies in an agent's workspace.

#include "keel/skills/skills.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/common/ids.h"

namespace keel::skills {
namespace {

namespace fs = std::filesystem;

std::string Md(const std::string& front, const std::string& body = "Do it.\n") {
  return "---\n" + front + "---\n" + body;
}

TEST(FrontMatterTest, ReadsNameDescriptionOtherKeysAndBody) {
  auto fm = ParseFrontMatter(
      Md("name: pdf-forms\ndescription: Fill PDF forms.\nlicense: MIT\n", "# PDF\nSteps.\n"));
  ASSERT_TRUE(fm.ok()) << fm.status().ToString();
  EXPECT_EQ(fm->name, "pdf-forms");
  EXPECT_EQ(fm->description, "Fill PDF forms.");
  EXPECT_EQ(fm->fields.at("license"), "MIT");
  EXPECT_EQ(fm->body, "# PDF\nSteps.\n");
}

TEST(FrontMatterTest, QuotedFoldedAndBlockValues) {
  auto quoted = ParseFrontMatter(Md("name: \"x\"\ndescription: 'It''s: \"quoted\"' # note\n"));
  ASSERT_TRUE(quoted.ok()) << quoted.status().ToString();
  EXPECT_EQ(quoted->name, "x");
  EXPECT_EQ(quoted->description, "It's: \"quoted\"");

  auto escaped = ParseFrontMatter(Md("name: x\ndescription: \"a\\\"b\\\\c\"\n"));
  ASSERT_TRUE(escaped.ok()) << escaped.status().ToString();
  EXPECT_EQ(escaped->description, "a\"b\\c");

  auto folded = ParseFrontMatter(Md("name: x\ndescription: first line\n  second line\n"));
  ASSERT_TRUE(folded.ok()) << folded.status().ToString();
  EXPECT_EQ(folded->description, "first line second line");

  auto block = ParseFrontMatter(Md("name: x\ndescription: >\n  one\n  two\nlist: |\n  a\n  b\n"));
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  EXPECT_EQ(block->description, "one two");
  EXPECT_EQ(block->fields.at("list"), "a\nb");

  auto crlf = ParseFrontMatter("---\r\nname: x\r\ndescription: d\r\n---\r\nbody\r\n");
  ASSERT_TRUE(crlf.ok()) << crlf.status().ToString();
  EXPECT_EQ(crlf->description, "d");

  auto comments = ParseFrontMatter(Md("# a comment\n\nname: x\ndescription: d\n"));
  ASSERT_TRUE(comments.ok()) << comments.status().ToString();
}

TEST(FrontMatterTest, RefusesWhatIsNotFrontMatterNamingTheProblem) {
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"# Just markdown\n", "no front matter"},
      {"", "no front matter"},
      {"---\nname: x\ndescription: d\n", "no closing '---'"},
      {Md("description: d\n"), "no 'name'"},
      {Md("name: x\n"), "no 'description'"},
      {Md("name: x\ndescription:\n"), "no 'description'"},
      {Md("name: x\ndescription: \"\"\n"), "no 'description'"},
      {Md("name: Bad_Name\ndescription: d\n"), "a-z, 0-9"},
      {Md("name: " + std::string(65, 'a') + "\ndescription: d\n"), "1 to 64"},
      {Md("name: x\ndescription: d\nname: y\n"), "sets 'name' twice"},
      {Md("name: x\ndescription: d\njust words\n"), "not 'key: value'"},
      {Md("name: x\ndescription: \"open\n"), "not closed"},
      {Md("name: x\ndescription: \"a\" b\n"), "after the closing quote"},
      {Md("name: x\ndescription: " + std::string(1025, 'd') + "\n"), "longer than 1024"},
  };
  for (const auto& c : cases) {
    auto fm = ParseFrontMatter(c.text);
    ASSERT_FALSE(fm.ok()) << c.text;
    EXPECT_EQ(fm.status().code(), Code::kInvalidArgument) << c.text;
    EXPECT_NE(fm.status().message().find(c.says), std::string::npos)
        << c.text << " -> " << fm.status().message();
  }
}

Json Files(Json extra = Json::object()) {
  Json files = {{"SKILL.md", Md("name: pdf\ndescription: Fill PDF forms.\n")}};
  for (auto it = extra.begin(); it != extra.end(); ++it) files[it.key()] = it.value();
  return files;
}

TEST(SkillOfTest, BuildsTheSkillWithManifestHashAndCanonicalBase64) {
  auto skill = SkillOf(Files({{"scripts/fill.py", "print(1)\n"}, {"a.bin", {{"base64", "AAEC"}}}}));
  ASSERT_TRUE(skill.ok()) << skill.status().ToString();
  EXPECT_EQ(skill->name, "pdf");
  EXPECT_EQ(skill->description, "Fill PDF forms.");
  EXPECT_EQ(skill->hash.size(), 64u);
  ASSERT_EQ(skill->manifest.size(), 3u);
  EXPECT_EQ(skill->manifest[0], (Json{{"path", "SKILL.md"},
                                      {"bytes", Files()["SKILL.md"].get<std::string>().size()},
                                      {"binary", false}}));
  EXPECT_EQ(skill->manifest[1], (Json{{"path", "a.bin"}, {"bytes", 3}, {"binary", true}}));
  EXPECT_EQ(skill->files["a.bin"], (Json{{"base64", "AAEC"}}));
  auto bytes = FileBytes(*skill, "a.bin");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, std::string("\0\1\2", 3));
  EXPECT_EQ(FileBytes(*skill, "nope").status().code(), Code::kNotFound);

  // Padding is optional on the way in and canonical on the way out; the hash is of the bytes.
  auto unpadded = SkillOf(Files({{"a.bin", {{"base64", "AAE"}}}}));
  ASSERT_TRUE(unpadded.ok()) << unpadded.status().ToString();
  EXPECT_EQ(unpadded->files["a.bin"], (Json{{"base64", "AAE="}}));
  auto padded = SkillOf(Files({{"a.bin", {{"base64", "AAE="}}}}));
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->hash, unpadded->hash);
  auto changed = SkillOf(Files({{"a.bin", {{"base64", "AAI="}}}}));
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed->hash, padded->hash);
}

TEST(SkillOfTest, RefusesBadSkillsNamingTheProblem) {
  struct Case {
    Json files;
    std::string says;
  };
  const std::string big(kMaxFileBytes + 1, 'x');
  Json many = Files();
  for (size_t i = 0; i < kMaxFiles; ++i) many["f" + std::to_string(i)] = "x";
  Json heavy = Files();
  for (int i = 0; i < 9; ++i) heavy["f" + std::to_string(i)] = std::string(kMaxFileBytes, 'x');
  const std::vector<Case> cases = {
      {Json::array(), "files must be an object"},
      {Json{{"README.md", "x"}}, "needs a file SKILL.md"},
      {Json{{"SKILL.md", "no front matter"}}, "no front matter"},
      {Files({{"/etc/passwd", "x"}}), "is absolute"},
      {Files({{"../up", "x"}}), "contains '..'"},
      {Files({{"a/../../b", "x"}}), "contains '..'"},
      {Files({{"./a", "x"}}), "contains '.'"},
      {Files({{"a//b", "x"}}), "empty component"},
      {Files({{"a/", "x"}}), "empty component"},
      {Files({{"a\\b", "x"}}), "backslash"},
      {Files({{"a\nb", "x"}}), "control character"},
      {Files({{std::string(256, 'a'), "x"}}), "longer than 255"},
      {Files({{"a", "x"}, {"a/b", "y"}}), "also a directory"},
      {Files({{"a", "x"}, {"a-b", "z"}, {"a/b", "y"}}), "also a directory"},
      {Files({{"big.txt", big}}), "larger than 1 MiB"},
      {heavy, "larger than 8 MiB"},
      {many, "at most 200 files"},
      {Files({{"x", 42}}), "must be text or {\"base64\""},
      {Files({{"x", {{"base64", "!!"}}}}), "base64 is not valid"},
      {Files({{"x", {{"base64", "AA"}, {"more", 1}}}}), "must be text or"},
      {Json{{"SKILL.md", {{"base64", "LS0t"}}}}, "SKILL.md must be text"},
  };
  for (const auto& c : cases) {
    auto skill = SkillOf(c.files);
    ASSERT_FALSE(skill.ok()) << c.says;
    EXPECT_EQ(skill.status().code(), Code::kInvalidArgument) << c.says;
    EXPECT_NE(skill.status().message().find(c.says), std::string::npos)
        << c.says << " -> " << skill.status().message();
  }
}

TEST(SkillIndexTest, ListsNamesAndDescriptionsAndSaysHowToRead) {
  EXPECT_EQ(SkillIndex({}), "");
  store::Skill a, b;
  a.name = "csv";
  a.description = "Read tables.";
  b.name = "pdf";
  b.description = "Fill forms.";
  std::string index = SkillIndex({a, b});
  EXPECT_NE(index.find("- csv: Read tables.\n- pdf: Fill forms.\n"), std::string::npos) << index;
  EXPECT_NE(index.find("skills.read"), std::string::npos);
  EXPECT_NE(index.find("skills/NAME/"), std::string::npos);
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SyncTest : public ::testing::Test {
 protected:
  void SetUp() override { ws_ = fs::temp_directory_path() / ("keel-skill-ws-" + NewId()); }
  void TearDown() override { fs::remove_all(ws_); }

  store::Skill Skill(const std::string& name, const std::string& body) {
    auto s = SkillOf({{"SKILL.md", Md("name: " + name + "\ndescription: d\n", body)},
                      {"lib/util.txt", name + " util"},
                      {"bin/x", {{"base64", "AP8="}}}});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return *s;
  }
  static store::Skill WithoutFiles(store::Skill s) {
    s.files = nullptr;
    return s;
  }

  fs::path ws_;
};

TEST_F(SyncTest, CopiesOnlyWhatChangedAndRemovesWhatIsNotAssigned) {
  store::Skill pdf = Skill("pdf", "v1"), csv = Skill("csv", "c");
  EXPECT_EQ(StaleSkills(ws_.string(), {pdf, csv}), (std::vector<std::string>{"pdf", "csv"}));
  ASSERT_TRUE(SyncWorkspace(ws_.string(), {pdf, csv}).ok());
  EXPECT_EQ(Slurp(ws_ / "skills/pdf/SKILL.md"), Md("name: pdf\ndescription: d\n", "v1"));
  EXPECT_EQ(Slurp(ws_ / "skills/pdf/lib/util.txt"), "pdf util");
  EXPECT_EQ(Slurp(ws_ / "skills/csv/bin/x"), std::string("\0\xff", 2));
  EXPECT_TRUE(StaleSkills(ws_.string(), {pdf, csv}).empty());

  // A file the agent left in a current copy stays: it is not copied again.
  std::ofstream(ws_ / "skills/csv/mine.txt") << "mine";
  store::Skill pdf2 = Skill("pdf", "v2");
  EXPECT_EQ(StaleSkills(ws_.string(), {pdf2, csv}), (std::vector<std::string>{"pdf"}));
  ASSERT_TRUE(SyncWorkspace(ws_.string(), {pdf2, WithoutFiles(csv)}).ok());
  EXPECT_EQ(Slurp(ws_ / "skills/pdf/SKILL.md"), Md("name: pdf\ndescription: d\n", "v2"));
  EXPECT_TRUE(fs::exists(ws_ / "skills/csv/mine.txt"));

  // csv unassigned, and a stray directory: both go.
  fs::create_directories(ws_ / "skills/stray");
  ASSERT_TRUE(SyncWorkspace(ws_.string(), {WithoutFiles(pdf2)}).ok());
  EXPECT_FALSE(fs::exists(ws_ / "skills/csv"));
  EXPECT_FALSE(fs::exists(ws_ / "skills/stray"));
  EXPECT_FALSE(fs::exists(ws_ / ".keel/skills/csv.sha256"));
  EXPECT_TRUE(fs::exists(ws_ / "skills/pdf/SKILL.md"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ws_ / "skills")) left.push_back(e.path().filename());
  EXPECT_EQ(left, (std::vector<std::string>{"pdf"}));

  // A copy the agent removed is stale again.
  fs::remove_all(ws_ / "skills/pdf");
  EXPECT_EQ(StaleSkills(ws_.string(), {pdf2}), (std::vector<std::string>{"pdf"}));
}

TEST_F(SyncTest, ASkillsDirectoryLeadingOutOfTheWorkspaceIsRefused) {
  fs::path outside = fs::temp_directory_path() / ("keel-outside-" + NewId());
  fs::create_directories(outside);
  fs::create_directories(ws_);
  fs::create_directory_symlink(outside, ws_ / "skills");
  Status st = SyncWorkspace(ws_.string(), {Skill("pdf", "x")});
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  EXPECT_TRUE(fs::is_empty(outside));
  fs::remove_all(outside);
}

TEST_F(SyncTest, ASkillDirectoryThatIsALinkIsReplacedNotFollowed) {
  fs::path outside = fs::temp_directory_path() / ("keel-outside-" + NewId());
  fs::create_directories(outside);
  std::ofstream(outside / "keep.txt") << "keep";
  fs::create_directories(ws_ / "skills");
  fs::create_directory_symlink(outside, ws_ / "skills/pdf");
  ASSERT_TRUE(SyncWorkspace(ws_.string(), {Skill("pdf", "x")}).ok());
  EXPECT_FALSE(fs::is_symlink(ws_ / "skills/pdf"));
  EXPECT_TRUE(fs::exists(ws_ / "skills/pdf/SKILL.md"));
  EXPECT_EQ(Slurp(outside / "keep.txt"), "keep");
  EXPECT_FALSE(fs::exists(outside / "SKILL.md"));
  fs::remove_all(outside);
}

}  // namespace
}  // namespace keel::skills
