// Envelope encryption of secrets: the AES-256-GCM box, key parsing, and the Vault on a real
// SQLite store (the store ports themselves are covered by the conformance suite).

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/secrets/secret_box.h"
#include "keel/secrets/vault.h"
#include "keel/store/store.h"

namespace keel::secrets {
namespace {

const char* kKekA = "qrgtqbq0i7Hk1I0qk1IeX2Q4bHh2yv6rk0Dq0Ys0RkA=";  // 32 bytes, standard base64
const char* kKekB = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";   // 32 bytes, url-safe

TEST(SecretBoxTest, KeysParseFromBothBase64AlphabetsAndRefuseOtherSizes) {
  auto a = Key::FromBase64(kKekA, "KEEL_SECRET_KEK");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->bytes().size(), 32u);
  ASSERT_TRUE(Key::FromBase64(kKekB, "K").ok());
  EXPECT_NE(a->Fingerprint(), Key::FromBase64(kKekB, "K")->Fingerprint());
  auto short_key = Key::FromBase64("c2hvcnQ=", "KEEL_SECRET_KEK");
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("decodes to 5 bytes"), std::string::npos);
  EXPECT_NE(short_key.status().message().find("KEEL_SECRET_KEK"), std::string::npos);
  auto garbage = Key::FromBase64("not base64 at all!!", "KEEL_SECRET_KEK");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("not base64"), std::string::npos);
}

TEST(SecretBoxTest, SealedValuesOpenOnlyWithTheirKeyAndAssociatedData) {
  Key key = Key::Random();
  std::string sealed = Seal(key, "hunter2", "tenant|name");
  EXPECT_EQ(sealed.find("hunter2"), std::string::npos);
  EXPECT_NE(Seal(key, "hunter2", "tenant|name"), sealed) << "nonces must differ";
  auto opened = Open(key, sealed, "tenant|name");
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(*opened, "hunter2");
  EXPECT_FALSE(Open(key, sealed, "tenant|other").ok());
  EXPECT_FALSE(Open(Key::Random(), sealed, "tenant|name").ok());
  std::string raw = Base64UrlDecode(sealed);
  raw[14] ^= 1;  // one bit of the ciphertext
  EXPECT_FALSE(Open(key, Base64UrlEncode(raw), "tenant|name").ok());
  EXPECT_FALSE(Open(key, "AAAA", "tenant|name").ok());
  auto empty = Open(key, Seal(key, "", "x"), "x");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

class VaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-vault-" + NewId());
    std::filesystem::create_directories(dir_);
    store::StoreOptions o;
    o.origin = "vault-test";
    auto opened = store::OpenStore("sqlite://" + (dir_ / "keel.db").string(), o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    for (auto* t : {&a_, &b_}) {
      *t = store::Tenant{NewId(), "t", NowMillis()};
      ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) { return tx.tenants().InsertTenant(*t); })
                      .ok());
    }
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  Status Put(const Vault& v, const store::Tenant& t, const std::string& name,
             const std::string& value) {
    // As PUT /v1/secrets does: the secret.set@v1 event carries the rows Put wrote.
    return store_->WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(v.Put(tx, t.id, name, value, NowMillis()).status());
      return tx.events().Append({t.id, "secret.set@v1", "", "", "", {{"name", name}}});
    });
  }
  Result<std::string> Get(const Vault& v, const store::Tenant& t, const std::string& name) {
    Result<std::string> out = Internal("not read");
    Status st = store_->Read([&](store::Tx& tx) -> Status {
      out = v.Get(tx, t.id, name);
      return Status::Ok();
    });
    if (!st.ok()) return st;
    return out;
  }
  std::string FileBytes() {
    std::string all;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    return all;
  }

  std::filesystem::path dir_;
  std::unique_ptr<store::Store> store_;
  store::Tenant a_, b_;
};

TEST_F(VaultTest, ValuesRoundTripPerTenantAndNeverReachTheFile) {
  Vault v = Vault::FromKekText(kKekA);
  ASSERT_TRUE(v.ready().ok());
  ASSERT_TRUE(Put(v, a_, "api-key", "sk-very-secret-value-1").ok());
  ASSERT_TRUE(Put(v, b_, "api-key", "sk-other-tenant-value-2").ok());
  EXPECT_EQ(*Get(v, a_, "api-key"), "sk-very-secret-value-1");
  EXPECT_EQ(*Get(v, b_, "api-key"), "sk-other-tenant-value-2");
  ASSERT_TRUE(Put(v, a_, "api-key", "sk-replaced-value-3").ok());
  EXPECT_EQ(*Get(v, a_, "api-key"), "sk-replaced-value-3");
  EXPECT_EQ(Get(v, a_, "missing").status().code(), Code::kNotFound);
  // A value sealed for one tenant does not open as another's (associated data and data key).
  ASSERT_TRUE(store_->WriteSync([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto s, tx.secrets().GetSecret(a_.id, "api-key"));
    s.tenant_id = b_.id;
    s.name = "copied";
    return tx.secrets().PutSecret(s);
  }).ok());
  EXPECT_EQ(Get(v, b_, "copied").status().code(), Code::kInternal);
  // Checkpoint the WAL so the main file holds everything, then look for plaintext anywhere.
  store_.reset();
  std::string bytes = FileBytes();
  for (const char* plain : {"sk-very-secret-value-1", "sk-other-tenant-value-2",
                            "sk-replaced-value-3"}) {
    EXPECT_EQ(bytes.find(plain), std::string::npos) << plain << " is in the database files";
  }
}

TEST_F(VaultTest, MissingMalformedOrOtherKeysFailClosed) {
  Vault none = Vault::FromKekText("");
  EXPECT_EQ(none.ready().code(), Code::kUnavailable);
  EXPECT_NE(none.ready().message().find("KEEL_SECRET_KEK is not set"), std::string::npos);
  Status st = Put(none, a_, "x", "v");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  Vault bad = Vault::FromKekText("dG9vIHNob3J0");
  EXPECT_NE(bad.ready().message().find("32 bytes"), std::string::npos);
  EXPECT_EQ(Put(bad, a_, "x", "v").code(), Code::kUnavailable);

  Vault first = Vault::FromKekText(kKekA);
  ASSERT_TRUE(Put(first, a_, "x", "v").ok());
  Vault second = Vault::FromKekText(kKekB);
  auto got = Get(second, a_, "x");
  EXPECT_EQ(got.status().code(), Code::kUnavailable);
  EXPECT_NE(got.status().message().find("another KEEL_SECRET_KEK"), std::string::npos)
      << got.status().message();
  EXPECT_EQ(Put(second, a_, "y", "v").code(), Code::kUnavailable) << "no second data key";
}

TEST_F(VaultTest, NamesAndSizesAreChecked) {
  Vault v = Vault::FromKekText(kKekA);
  EXPECT_TRUE(Vault::CheckName("OPENAI_API_KEY.v2-x").ok());
  EXPECT_EQ(Vault::CheckName("").code(), Code::kInvalidArgument);
  EXPECT_EQ(Vault::CheckName("a/b").code(), Code::kInvalidArgument);
  EXPECT_EQ(Vault::CheckName(std::string(129, 'a')).code(), Code::kInvalidArgument);
  EXPECT_EQ(Put(v, a_, "big", std::string(kMaxSecretBytes + 1, 'x')).code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(Put(v, a_, "big", std::string(kMaxSecretBytes, 'x')).ok());
}

}  // namespace
}  // namespace keel::secrets
